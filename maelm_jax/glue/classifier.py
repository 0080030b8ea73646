"""An export as transformers' sequence classifier, pretrained or at random init (the control).

The class is whatever `AutoModelForSequenceClassification` picks for the export, so every
export kind fine-tunes unchanged: `RobertaForSequenceClassification`, the remote-code
`MaelmForSequenceClassification` (relative bias) and native `ModernBertForSequenceClassification`.
Remote code is trusted only where the export ships it (`auto_map` in config.json, written by
our exporter). Fine-tuning dropout is the recipe's, not pretraining's: the demo pretrains
without dropout, and its export's config says so.
"""

import json
import os

from maelm_jax.config.run_config import ConfigError

INITS = ("pretrained", "random")
# Where each config family keeps its dropout rates (the recipe sets them all).
_DROPOUT_KEYS = {
    "modernbert": ("embedding_dropout", "mlp_dropout", "classifier_dropout"),
    "default": ("hidden_dropout_prob",),
}
_ATTENTION_DROPOUT_KEYS = {
    "modernbert": ("attention_dropout",),
    "default": ("attention_probs_dropout_prob",),
}


def export_config(export_dir: str, flag: str = "--export") -> dict:
    """config.json of an export; ConfigError naming the folder (as `flag` gave it) if it is
    not one."""
    path = os.path.join(export_dir, "config.json")
    weights = [
        n
        for n in ("model.safetensors", "pytorch_model.bin")
        if os.path.isfile(os.path.join(export_dir, n))
    ]
    if not os.path.isdir(export_dir) or not os.path.isfile(path) or not weights:
        raise ConfigError(
            f"{flag}={export_dir}: not a HuggingFace export (needs config.json and "
            "model.safetensors, as `python -m maelm_jax.export` writes them)"
        )
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag}={export_dir}: config.json unreadable ({e})") from None


def needs_remote_code(export_dir: str) -> bool:
    return "auto_map" in export_config(export_dir)


def tokenizer(export_dir: str):
    """The export's own fast tokenizer (plain `tokenizer.json`, no code). `AutoTokenizer`
    reads config.json first: today's exports say `"model_type": "roberta"` and load without
    remote code, but relative-bias exports written before 2026-11-28 name a config type only
    their shipped code defines, and transformers would stop to ask before importing it. So
    the tokenizer gets the same `trust_remote_code` as the model."""
    from transformers import AutoTokenizer

    if not os.path.isfile(os.path.join(export_dir, "tokenizer.json")):
        raise ConfigError(f"--export={export_dir}: no tokenizer.json (not an export of ours?)")
    return AutoTokenizer.from_pretrained(
        export_dir, trust_remote_code=needs_remote_code(export_dir)
    )


def classifier(
    export_dir: str,
    num_labels: int,
    init: str,
    dropout: float,
    attention_dropout: float,
):
    """`AutoModelForSequenceClassification` on the export: its encoder with a fresh head
    (`pretrained`), or the same architecture entirely fresh (`random`), as transformers
    initialises it."""
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    if init not in INITS:
        raise ConfigError(f"init={init!r}; allowed: {', '.join(INITS)}")
    remote = needs_remote_code(export_dir)
    config = AutoConfig.from_pretrained(export_dir, trust_remote_code=remote)
    config.num_labels = num_labels
    config.problem_type = "regression" if num_labels == 1 else "single_label_classification"
    family = "modernbert" if config.model_type == "modernbert" else "default"
    for key in _DROPOUT_KEYS[family]:
        setattr(config, key, dropout)
    for key in _ATTENTION_DROPOUT_KEYS[family]:
        setattr(config, key, attention_dropout)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: classifier.*" is the point here
    try:
        if init == "random":
            return AutoModelForSequenceClassification.from_config(config, trust_remote_code=remote)
        return AutoModelForSequenceClassification.from_pretrained(
            export_dir, config=config, trust_remote_code=remote
        )
    finally:
        hf_logging.set_verbosity(verbosity)


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
