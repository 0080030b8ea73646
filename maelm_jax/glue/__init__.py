"""GLUE fine-tuning of an export in PyTorch: the tasks as GLUE ships them, their metrics,
the recipe's grid over seeds, and the report (`python -m maelm_jax.finetune`)."""
