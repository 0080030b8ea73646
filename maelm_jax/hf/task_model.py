"""An export with a fresh task head, for fine-tuning: its pretrained encoder, or the same
architecture at random init (the control row).

The class is whatever transformers' auto class picks for the export, so every export kind
fine-tunes unchanged: for question answering `RobertaForQuestionAnswering` (plain RoBERTa),
the remote-code `MaelmForQuestionAnswering` (relative bias, hf/modeling.py) and transformers'
`ModernBertForQuestionAnswering` (modern backbone). Remote code is trusted only where the
export ships it (`auto_map` in config.json, written by our exporter). Dropout is the
fine-tuning recipe's, not pretraining's: the demo pretrains without dropout, and its export's
config says so.
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
# The auto classes fine-tuning builds, with the table of model types transformers itself
# serves with each (transformers.models.auto.modeling_auto).
AUTO_CLASSES = {
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
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


def max_positions(export_dir: str) -> int:
    """The tokens a row of the export may hold: its tokenizer's `model_max_length`, which the
    exporter sets to the model's positions (config.json's `max_position_embeddings` counts
    RoBERTa's padding offset too: 514 for 512)."""
    config = export_config(export_dir)
    stored = config.get("max_position_embeddings", 0)
    if config.get("model_type") != "modernbert":  # RoBERTa's positions start after the pad
        stored -= config.get("pad_token_id", 1) + 1
    return min(stored, tokenizer(export_dir).model_max_length)


def task_model(
    auto_class: str,
    export_dir: str,
    init: str,
    dropout: float,
    attention_dropout: float,
    **config_updates,
):
    """`transformers.<auto_class>` on the export with `config_updates` set on its config (e.g.
    `num_labels`): the pretrained encoder with a fresh head, or all of it fresh (`random`),
    as transformers initialises it. ConfigError, in one line, where the export has no such
    class: an export written before its code had one, or a transformers without it."""
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.utils import logging as hf_logging

    if init not in INITS:
        raise ConfigError(f"init={init!r}; allowed: {', '.join(INITS)}")
    if auto_class not in AUTO_CLASSES:
        raise ConfigError(f"auto_class={auto_class!r}; allowed: {', '.join(AUTO_CLASSES)}")
    saved = export_config(export_dir)
    remote = "auto_map" in saved
    if remote and auto_class not in saved["auto_map"]:
        raise ConfigError(
            f"export_dir={export_dir}: its modeling code has no {auto_class} (auto_map: "
            f"{', '.join(sorted(saved['auto_map']))}); re-export the checkpoint with "
            "`python -m maelm_jax.export` for one that has"
        )
    names = getattr(modeling_auto, AUTO_CLASSES[auto_class])
    if not remote and saved.get("model_type") not in names:
        raise ConfigError(
            f"export_dir={export_dir}: transformers {transformers.__version__} has no "
            f"{auto_class} for model_type {saved.get('model_type')!r}; upgrade transformers"
        )
    auto = getattr(transformers, auto_class)
    config = transformers.AutoConfig.from_pretrained(export_dir, trust_remote_code=remote)
    family = "modernbert" if config.model_type == "modernbert" else "default"
    for key in _DROPOUT_KEYS[family]:
        setattr(config, key, dropout)
    for key in _ATTENTION_DROPOUT_KEYS[family]:
        setattr(config, key, attention_dropout)
    for key, value in config_updates.items():
        setattr(config, key, value)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: <head>.*" is the point here
    try:
        if init == "random":
            return auto.from_config(config, trust_remote_code=remote)
        return auto.from_pretrained(export_dir, config=config, trust_remote_code=remote)
    finally:
        hf_logging.set_verbosity(verbosity)


def load_for_question_answering(
    export_dir: str, init: str = "pretrained", dropout: float = 0.1, attention_dropout: float = 0.1
):
    """The export as an extractive-QA model (SQuAD): start/end logits [B, T] from a linear
    head on every position, loss (CE_start + CE_end) / 2 given `start_positions` and
    `end_positions` [B]. Dropout defaults to the papers' SQuAD recipe (0.1)."""
    return task_model("AutoModelForQuestionAnswering", export_dir, init, dropout, attention_dropout)
