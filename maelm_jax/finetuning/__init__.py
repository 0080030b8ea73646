"""Fine-tuning an export in PyTorch, for every task family (GLUE, SQuAD): the recipe's grid
over seeds, resumed run by run (search.py), the loop (training.py) with its model on the device
(model_slot.py), each family's data, model, loss and evaluation (glue_runs.py, squad_runs.py)
and the report (`python -m maelm_jax.finetune`)."""
