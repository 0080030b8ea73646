"""maelm_jax: MLM, MAE-LM and 3ML pretraining in JAX/Flax for TPU pods."""
