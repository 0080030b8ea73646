"""Our encoder's parameters -> a HuggingFace RoBERTa state dict and config.json, exactly.

The traps, each handled here: RoBERTa's positions start at padding_idx + 1, so the table
gets two zero rows in front (`max_position_embeddings = max_positions + 2`); one zero
token-type row (`type_vocab_size=1`); the embedding's padding rows (vocab rounded up to a
multiple of 128) are cut to the tokenizer's size, and so is the LM-head bias; scanned
layers are unstacked; attention kernels [E, heads, head_dim] become Linear weights
[heads * head_dim, E] (the output kernel is already [E, heads * head_dim]); Dense kernels
[in, out] are transposed; LayerNorm eps and exact GELU ("gelu") are copied.
"""

import dataclasses

import numpy as np

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from maelm_jax.model.positions.relative_bias import relative_position_buckets

# The ModelConfig fields the conversion below represents. A field added later (a new
# encoder feature) is refused by `unsupported_fields` until it is handled here.
REPRESENTED_FIELDS = {
    "objective",
    "vocab_size",
    "num_layers",
    "hidden_size",
    "num_heads",
    "mlp_dim",
    "max_positions",
    "relative_attention_buckets",
    "relative_attention_max_distance",
    "layer_norm_epsilon",
    "init_std",
    "relative_attention_init_slope",  # where the bias table starts; training moves it
    "relative_attention_init_cap",
    "dropout_rate",
    "attention_dropout_rate",
    # Pretraining-only: the decoder is dropped; dtype, layer layout and remat change how
    # the encoder is computed, not what it computes (the export is float32).
    "decoder",
    "num_decoder_layers",
    "decoder_dropout_rate",
    "decoder_attention_dropout_rate",
    "decoder_relative_attention",
    "decoder_relative_attention_init_slope",
    "mask_token_source",
    "dtype",
    "scan_layers",
    "scan_unroll",
    "embedding_grad",  # how the gradient is summed, not what the lookup computes
    "remat_policy",
    "decoder_remat_policy",
    "attention_query_chunk",
    "lm_head_chunk",
    # Kernels and score precision: the same attention, computed another way; the export's
    # float32 scores are what a float32 model computes with either setting.
    "attention_impl",
    "attention_dropout_impl",
    "kernel_interpret",
    "encoder_length_multiple",  # slots the encoder pads and cuts, outputs unchanged
    "float32_attention_logits",
    "relative_bias_once",
    "relative_bias_grad",
    "relative_bias_impl",
    "gather_embedding_table",  # where the lookup reads the table, not what it reads
    # The backbone picks the converter: this module for "roberta", modern_convert.py for
    # "modern", which represents the rotary and window keys (unread by "roberta").
    "backbone",
    "rope_theta_global",
    "rope_theta_local",
    "local_attention",
    "global_attention_every_n_layers",
    "local_attention_block",  # how the window is computed, not what it is
}


def unsupported_fields(model_config: ModelConfig) -> list[str]:
    """Model settings this converter does not know, so cannot promise to represent."""
    names = [f.name for f in dataclasses.fields(model_config)]
    return [n for n in names if n not in REPRESENTED_FIELDS]


def uses_relative_bias(model_config: ModelConfig) -> bool:
    return model_config.relative_attention_buckets > 0


def hf_config(model_config: ModelConfig, vocab_size: int, with_lm_head: bool) -> dict:
    """config.json for `RobertaModel`/`RobertaForMaskedLM`, or for the custom class
    (`modeling_maelm.py`, loaded with trust_remote_code) when the encoder has the bias."""
    cfg = model_config
    config = {
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu",  # exact (erf) GELU, as nn.gelu(approximate=False)
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.attention_dropout_rate,
        "max_position_embeddings": cfg.max_positions + PAD_ID + 1,
        "type_vocab_size": 1,
        "initializer_range": cfg.init_std,
        "layer_norm_eps": cfg.layer_norm_epsilon,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    if not uses_relative_bias(cfg):
        config["model_type"] = "roberta"
        config["architectures"] = ["RobertaForMaskedLM" if with_lm_head else "RobertaModel"]
        return config
    table = relative_position_buckets(
        cfg.relative_attention_buckets, cfg.relative_attention_max_distance, cfg.max_positions
    )
    # model_type "roberta", a type transformers knows, so that whatever reads config.json
    # without trust_remote_code (AutoTokenizer does, before it reads the tokenizer files; so do
    # AutoConfig and pipelines) gets RobertaConfig without asking whether to run our code. The
    # model itself still needs the code: auto_map names our classes, which load only with
    # trust_remote_code=True; without it transformers builds a plain RobertaModel and its load
    # report names the bias table UNEXPECTED (docs/export.md).
    config.update(
        model_type="roberta",
        architectures=["MaelmForMaskedLM" if with_lm_head else "MaelmModel"],
        relative_attention_num_buckets=cfg.relative_attention_buckets,
        relative_attention_max_distance=cfg.relative_attention_max_distance,
        relative_attention_bucket_table=[int(b) for b in table],
        auto_map=auto_map(with_lm_head),
    )
    return config


def auto_map(with_lm_head: bool) -> dict[str, str]:
    """The relative-bias export's `auto_map`: the transformers auto classes its shipped code
    serves. `AutoModelForMaskedLM` only with an LM head: an MAE-LM or 3ML encoder never
    predicted tokens (the decoder did), and the entry would let fill-mask predict from a
    freshly initialised head with only a warning. Without it, `from_pretrained(...,
    trust_remote_code=True)` stops with "Unrecognized configuration class ... MaelmConfig"."""
    classes = {
        "AutoConfig": "MaelmConfig",
        "AutoModel": "MaelmModel",
        "AutoModelForSequenceClassification": "MaelmForSequenceClassification",
        "AutoModelForQuestionAnswering": "MaelmForQuestionAnswering",
    }
    if with_lm_head:
        classes["AutoModelForMaskedLM"] = "MaelmForMaskedLM"
    return {auto: f"modeling_maelm.{name}" for auto, name in classes.items()}


def layers_of(encoder_params: dict, num_layers: int, scanned: bool) -> list[dict]:
    if not scanned:
        return [encoder_params[f"layers_{i}"] for i in range(num_layers)]
    stacked = encoder_params["layers"]

    def take(tree, i):
        if isinstance(tree, dict):
            return {k: take(v, i) for k, v in tree.items()}
        return tree[i]

    return [take(stacked, i) for i in range(num_layers)]


def _linear(prefix: str, kernel, bias) -> dict:
    """Dense kernel [in, out] -> Linear weight [out, in]."""
    return {f"{prefix}.weight": np.asarray(kernel).T, f"{prefix}.bias": np.asarray(bias)}


def _norm(prefix: str, p: dict) -> dict:
    return {f"{prefix}.weight": np.asarray(p["scale"]), f"{prefix}.bias": np.asarray(p["bias"])}


def _layer(prefix: str, p: dict, hidden: int) -> dict:
    att = p["attention"]
    out = {}
    for name in ("query", "key", "value"):
        kernel = np.asarray(att[f"{name}_kernel"]).reshape(hidden, -1)  # [E, N*H]
        bias = np.asarray(att[f"{name}_bias"]).reshape(-1)
        out |= _linear(f"{prefix}.attention.self.{name}", kernel, bias)
    out[f"{prefix}.attention.output.dense.weight"] = np.asarray(att["out_kernel"]).reshape(
        hidden, -1
    )
    out[f"{prefix}.attention.output.dense.bias"] = np.asarray(att["out_bias"])
    out |= _norm(f"{prefix}.attention.output.LayerNorm", p["attention_norm"])
    out |= _linear(f"{prefix}.intermediate.dense", p["mlp"]["wi"]["kernel"], p["mlp"]["wi"]["bias"])
    out |= _linear(f"{prefix}.output.dense", p["mlp"]["wo"]["kernel"], p["mlp"]["wo"]["bias"])
    out |= _norm(f"{prefix}.output.LayerNorm", p["mlp_norm"])
    return out


def state_dict(
    params: dict, model_config: ModelConfig, vocab_size: int, with_lm_head: bool
) -> dict[str, np.ndarray]:
    """float32 arrays named as `RobertaModel` (keys without prefix) or, with the LM head, as
    `RobertaForMaskedLM` (`roberta.` prefix, `lm_head.*`). The tied decoder weight is not
    stored: transformers ties it to the word embeddings on load."""
    cfg = model_config
    enc = params["encoder"]
    base = "roberta." if with_lm_head else ""
    positions = np.asarray(enc["position_embed"]["embedding"])
    out = {
        f"{base}embeddings.word_embeddings.weight": np.asarray(params["token_embed"]["embedding"])[
            :vocab_size
        ],
        f"{base}embeddings.position_embeddings.weight": np.concatenate(
            [np.zeros((PAD_ID + 1, cfg.hidden_size), positions.dtype), positions]
        ),
        f"{base}embeddings.token_type_embeddings.weight": np.zeros(
            (1, cfg.hidden_size), np.float32
        ),
    }
    out |= _norm(f"{base}embeddings.LayerNorm", enc["embed_norm"])
    for i, layer in enumerate(layers_of(enc, cfg.num_layers, cfg.scan_layers)):
        out |= _layer(f"{base}encoder.layer.{i}", layer, cfg.hidden_size)
    if uses_relative_bias(cfg):
        out[f"{base}encoder.relative_attention_bias.weight"] = np.asarray(
            enc["relative_bias"]["embedding"]
        )
    if with_lm_head:
        head = params["lm_head"]
        out |= _linear("lm_head.dense", head["dense"]["kernel"], head["dense"]["bias"])
        out |= _norm("lm_head.layer_norm", head["norm"])
        out["lm_head.bias"] = np.asarray(head["output_bias"])[:vocab_size]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
