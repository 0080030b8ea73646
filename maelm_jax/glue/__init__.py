"""GLUE as the papers fine-tune on it: the tasks as GLUE ships them, their readers and
metrics, and the sequence classifier an export becomes (`maelm_jax/finetuning/` runs them)."""
