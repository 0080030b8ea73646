"""Which kernel computes an attention: `AttentionOptions`, made from the model's
`attention_impl` (made concrete per platform by `ModelConfig.for_platform`) and the layer's
dropout, read by `attention.attend` and `attention._attend_block`."""

import dataclasses

from maelm_jax.model.positions.rotary import Window


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """How `attend` computes: `impl` "cudnn" (GPU) serves every attention without
    probability dropout, and those with it too where `dropout_impl` is "cudnn"; "splash"
    (Pallas, TPU) those without a bias or dropout; "xla" the rest (and everything with impl
    "xla"); `relative_bias_impl` "triton" puts every attention with a factored relative
    bias (and no window) through kernels/relative_flash.py instead, whatever `impl` says;
    `interpret` runs a Pallas kernel in the interpreter (CPU tests); `logits_dtype` None:
    the queries' dtype."""

    impl: str = "xla"
    interpret: bool = False
    logits_dtype: object = None
    dropout_impl: str = "xla"  # "cudnn": cuDNN takes probability dropout too
    relative_bias_impl: str = "dense"

    def fused(self, bias, dropout_rng) -> bool:
        # "auto" not yet made concrete computes as "xla"
        if self.impl == "cudnn":  # any bias and mask; dropout where dropout_impl says
            return dropout_rng is None or self.dropout_impl == "cudnn"
        return self.impl == "splash" and bias is None and dropout_rng is None

    def dense_local(self, length: int, window: Window, dropout_rng=None) -> bool:
        """Whether a local layer of `length` queries runs as one masked kernel call rather
        than in blocks (`_attend_local`): cuDNN computes every score the mask hides, so only
        where the whole row is at most `KERNEL_LOCAL_SPANS` times what a block reaches
        (ModernBERT's 1024 tokens: 4 x 256)."""
        span = window.block + 2 * window.half
        fits = length <= KERNEL_LOCAL_SPANS * span
        return self.fused(None, dropout_rng) and self.impl == "cudnn" and fits


# A local layer up to this many block spans long runs as one masked cuDNN call (dense_local).
KERNEL_LOCAL_SPANS = 4

# Every attention on XLA: `attend`'s default.
XLA_PATH = AttentionOptions()
