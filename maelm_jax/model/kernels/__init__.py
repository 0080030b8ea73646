"""Fused attention kernels behind `attention._attend_block`: which one serves an attention
(`choice.AttentionOptions`), splash on TPU (`splash`) and cuDNN on GPU (`cudnn`)."""
