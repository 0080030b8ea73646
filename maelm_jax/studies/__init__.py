"""The papers' comparison as one resumable pipeline (`python -m maelm_jax.study`): each
objective pretrained, exported, fine-tuned on GLUE and measured, beside a random-init row."""
