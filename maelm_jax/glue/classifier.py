"""An export as transformers' sequence classifier, pretrained or at random init (the control).

The class is whatever `AutoModelForSequenceClassification` picks for the export
(`hf/task_model.py` builds it, as it builds SQuAD's question-answering model), so every export
kind fine-tunes unchanged: `RobertaForSequenceClassification`, the remote-code
`MaelmForSequenceClassification` (relative bias) and native `ModernBertForSequenceClassification`.
The export's config, tokenizer and positions are read there too (re-exported here, where GLUE's
callers name them).
"""

from maelm_jax.hf.task_model import (  # noqa: F401 (GLUE's callers' names for them)
    INITS,
    export_config,
    needs_remote_code,
    task_model,
    tokenizer,
)


def classifier(
    export_dir: str,
    num_labels: int,
    init: str,
    dropout: float,
    attention_dropout: float,
):
    """`AutoModelForSequenceClassification` on the export: its encoder with a fresh head
    (`pretrained`), or the same architecture entirely fresh (`random`); one label is STS-B's
    regression."""
    return task_model(
        "AutoModelForSequenceClassification",
        export_dir,
        init,
        dropout,
        attention_dropout,
        num_labels=num_labels,
        problem_type="regression" if num_labels == 1 else "single_label_classification",
    )


def read_first_token_only(model) -> bool:
    """Makes `model`'s last encoder layer compute `<s>`'s row alone, the only row the RoBERTa
    classification head reads: the same logits, less arithmetic. The relative-bias class does
    it itself (`hf/modeling.py`); a plain `RobertaForSequenceClassification` gets its last
    layer's `forward` replaced on the instance (parameter names, and so saving, unchanged).
    Other classes (ModernBERT may pool the mean) are left whole. True if the model reads
    `<s>` alone now."""
    import functools

    from transformers import RobertaForSequenceClassification

    from maelm_jax.hf.modeling import first_token_layer

    if getattr(type(model), "first_token_only", None) is not None:
        model.first_token_only = True
        return True
    if type(model) is not RobertaForSequenceClassification:
        return False
    last = model.roberta.encoder.layer[-1]

    def forward(layer, hidden_states, attention_mask=None, *args, **kwargs):
        return first_token_layer(layer, hidden_states, attention_mask)

    last.forward = functools.partial(forward, last)
    return True
