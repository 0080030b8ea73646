"""The edge between `ml_collections.ConfigDict` and the code: validation and frozen configs.

Everything downstream of `train_and_evaluate` receives the frozen dataclasses built here,
never the mutable ConfigDict, so a jitted function can close over them safely and a bad
value fails once, up front, with a message that names it.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp
import ml_collections

OBJECTIVES = ("mlm", "mae_lm")
DECODERS = ("self", "cross")
REMAT_POLICIES = ("none", "full", "dots_saveable")
NONFINITE_POLICIES = ("stop", "skip")
PACKINGS = ("segmented", "concatenated")  # see segments.py
MASK_TOKEN_SOURCES = ("embedding_row", "learned")  # see model.py
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
VOCAB_MULTIPLE = 128


class ConfigError(ValueError):
    """A user-supplied value (config, path, data) is not allowed; the message says why."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def padded_vocab_size(vocab_size: int) -> int:
    """Rounds up to a multiple of 128 so the vocab axis tiles and shards evenly."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def num_masked(mask_rate: float, seq_len: int) -> int:
    """The static k: every row has exactly this many masked slots."""
    return round(mask_rate * seq_len)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What the model code needs; `vocab_size` is already padded."""

    objective: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    mlp_dim: int
    decoder: str
    num_decoder_layers: int
    max_positions: int
    dropout_rate: float
    decoder_dropout_rate: float
    attention_dropout_rate: float
    decoder_attention_dropout_rate: float
    mask_token_source: str
    relative_attention_buckets: int
    relative_attention_max_distance: int
    dtype: Any
    scan_layers: bool
    remat_policy: str
    layer_norm_epsilon: float
    init_std: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How rows are masked; the special ids come from the tokenizer."""

    objective: str
    seq_len: int
    num_masked: int
    mlm_mask_prob: float
    mlm_random_prob: float
    vocab_size: int  # the tokenizer's (unpadded): random replacements stay inside it
    mask_id: int
    pad_id: int
    eos_id: int  # ends every document in a block: segment ids follow from it
    packing: str  # "segmented" | "concatenated", see segments.py
    special_ids: tuple[int, ...]  # never chosen while a row has enough other tokens
    first_regular_id: int  # random replacements are drawn from [first_regular_id, vocab_size)


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks the values that do not depend on devices or data; raises ConfigError."""
    m = config.model
    _require(
        config.objective in OBJECTIVES,
        f"objective={config.objective!r} is not allowed; use one of {OBJECTIVES}",
    )
    _require(
        0.0 < config.mask_rate < 1.0,
        f"mask_rate={config.mask_rate} is not allowed; it must lie strictly between 0 and 1",
    )
    _require(config.seq_len >= 2, f"seq_len={config.seq_len} is not allowed; it must be >= 2")
    k = num_masked(config.mask_rate, config.seq_len)
    _require(
        1 <= k < config.seq_len,
        f"mask_rate={config.mask_rate} with seq_len={config.seq_len} masks k={k} slots; "
        f"k must be between 1 and seq_len - 1",
    )
    _require(
        config.seq_len <= m.max_positions,
        f"seq_len={config.seq_len} exceeds model.max_positions={m.max_positions}; "
        "use seq_len <= max_positions",
    )
    for key in ("mlm_mask_prob", "mlm_random_prob"):
        _require(0.0 <= config[key] <= 1.0, f"{key}={config[key]} must lie in [0, 1]")
    _require(
        config.mlm_mask_prob + config.mlm_random_prob <= 1.0,
        f"mlm_mask_prob + mlm_random_prob = {config.mlm_mask_prob + config.mlm_random_prob}"
        " exceeds 1",
    )
    for key in ("batch_size", "num_train_steps"):
        _require(config[key] >= 1, f"{key}={config[key]} is not allowed; it must be >= 1")
    _require(
        config.grad_accum_steps >= 1 and config.batch_size % config.grad_accum_steps == 0,
        f"grad_accum_steps={config.grad_accum_steps} must be >= 1 and divide "
        f"batch_size={config.batch_size}",
    )
    for key in ("num_layers", "hidden_size", "num_heads", "mlp_dim"):
        _require(m[key] >= 1, f"model.{key}={m[key]} is not allowed; it must be >= 1")
    _require(
        m.hidden_size % m.num_heads == 0,
        f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}",
    )
    _require(m.decoder in DECODERS, f"model.decoder={m.decoder!r}; use one of {DECODERS}")
    _require(
        config.objective == "mlm" or m.num_decoder_layers >= 1,
        f"model.num_decoder_layers={m.num_decoder_layers}; objective 'mae_lm' needs >= 1",
    )
    _require(
        m.remat_policy in REMAT_POLICIES,
        f"model.remat_policy={m.remat_policy!r}; use one of {REMAT_POLICIES}",
    )
    _require(m.dtype in DTYPES, f"model.dtype={m.dtype!r}; use one of {tuple(DTYPES)}")
    for key in (
        "dropout_rate",
        "decoder_dropout_rate",
        "attention_dropout_rate",
        "decoder_attention_dropout_rate",
    ):
        _require(0.0 <= m[key] < 1.0, f"model.{key}={m[key]} must lie in [0, 1)")
    _require(
        m.mask_token_source in MASK_TOKEN_SOURCES,
        f"model.mask_token_source={m.mask_token_source!r}; use one of {MASK_TOKEN_SOURCES}",
    )
    _require(
        config.packing in PACKINGS,
        f"packing={config.packing!r} is not allowed; use one of {PACKINGS}",
    )
    _require(
        m.relative_attention_buckets >= 0,
        f"model.relative_attention_buckets={m.relative_attention_buckets} must be >= 0",
    )
    _require(config.vocab_size >= 16, f"vocab_size={config.vocab_size} must be >= 16")
    for key in (
        "log_every_steps",
        "eval_every_steps",
        "checkpoint_every_steps",
        "keep_checkpoints",
    ):
        _require(config[key] >= 1, f"{key}={config[key]} is not allowed; it must be >= 1")
    for key in ("eval_batches", "keep_every_steps"):
        _require(config[key] >= 0, f"{key}={config[key]} is not allowed; it must be >= 0")
    _require(
        config.nonfinite in NONFINITE_POLICIES,
        f"nonfinite={config.nonfinite!r} is not allowed; use one of {NONFINITE_POLICIES}",
    )


def model_config(config: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
    """Freezes `config.model`; `vocab_size` is the tokenizer's and gets padded here."""
    validate(config)
    m = config.model
    return ModelConfig(
        objective=config.objective,
        vocab_size=padded_vocab_size(vocab_size),
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_heads=m.num_heads,
        mlp_dim=m.mlp_dim,
        decoder=m.decoder,
        num_decoder_layers=m.num_decoder_layers if config.objective == "mae_lm" else 0,
        max_positions=m.max_positions,
        dropout_rate=m.dropout_rate,
        decoder_dropout_rate=m.decoder_dropout_rate,
        attention_dropout_rate=m.attention_dropout_rate,
        decoder_attention_dropout_rate=m.decoder_attention_dropout_rate,
        mask_token_source=m.mask_token_source,
        relative_attention_buckets=m.relative_attention_buckets,
        relative_attention_max_distance=m.relative_attention_max_distance,
        dtype=DTYPES[m.dtype],
        scan_layers=m.scan_layers,
        remat_policy=m.remat_policy,
        layer_norm_epsilon=m.layer_norm_epsilon,
        init_std=m.init_std,
    )


def masking_config(
    config: ml_collections.ConfigDict,
    *,
    vocab_size: int,
    mask_id: int,
    pad_id: int,
    eos_id: int,
    special_ids: tuple[int, ...],
    first_regular_id: int,
) -> MaskingConfig:
    """Freezes the masking settings together with the tokenizer's special ids."""
    validate(config)
    return MaskingConfig(
        objective=config.objective,
        seq_len=config.seq_len,
        num_masked=num_masked(config.mask_rate, config.seq_len),
        mlm_mask_prob=config.mlm_mask_prob,
        mlm_random_prob=config.mlm_random_prob,
        vocab_size=vocab_size,
        mask_id=mask_id,
        pad_id=pad_id,
        eos_id=eos_id,
        packing=config.packing,
        special_ids=tuple(special_ids),
        first_regular_id=first_regular_id,
    )
