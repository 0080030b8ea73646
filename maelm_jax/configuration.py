"""The edge between `ml_collections.ConfigDict` and the code: validation and frozen configs.

Everything downstream of `train_and_evaluate` receives the frozen dataclasses built here,
never the mutable ConfigDict, so a jitted function can close over them safely and a bad
value fails once, up front, with a message that names it.
"""

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import ml_collections

from maelm_jax import paths
from maelm_jax.model import remat

OBJECTIVES = ("mlm", "mae_lm")
DECODERS = ("self", "cross")
REMAT_POLICIES = ("none", *remat.POLICIES)
NONFINITE_POLICIES = ("stop", "skip")
PACKINGS = ("segmented", "concatenated")  # see segments.py
MASK_TOKEN_SOURCES = ("embedding_row", "learned")  # see model.py
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
VOCAB_MULTIPLE = 128


class ConfigError(ValueError):
    """A user-supplied value (config, path, data) is not allowed; the message says why."""


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
    relative_attention_init_slope: float
    decoder_relative_attention: bool
    dtype: Any
    scan_layers: bool
    remat_policy: str
    decoder_remat_policy: str
    attention_query_chunk: int
    lm_head_chunk: int
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


@dataclasses.dataclass(frozen=True)
class Rule:
    """One key's allowed values: `ok(value)` and the words that say what is allowed."""

    ok: Callable[[Any], bool]
    allowed: str


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(low, integer=True) -> Rule:
    kind = int if integer else (int, float)
    return Rule(
        lambda v: isinstance(v, kind) and not isinstance(v, bool) and math.isfinite(v) and v >= low,
        f"{'an integer' if integer else 'a finite number'} >= {low}",
    )


def between(low, high, *, low_open=False, high_open=False) -> Rule:
    def ok(v):
        if not _number(v) or not math.isfinite(v):
            return False
        return (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    return Rule(
        ok, f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    )


def positive_number() -> Rule:
    return Rule(lambda v: _number(v) and math.isfinite(v) and v > 0, "a finite number > 0")


def one_of(choices) -> Rule:
    return Rule(lambda v: v in choices, f"one of {tuple(choices)}")


def integer() -> Rule:
    return Rule(lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer")


# Every key with a range, checked in one place; adding a key is adding a line.
RULES: dict[str, Rule] = {
    "objective": one_of(OBJECTIVES),
    "mask_rate": between(0.0, 1.0, low_open=True, high_open=True),
    "mlm_mask_prob": between(0.0, 1.0),
    "mlm_random_prob": between(0.0, 1.0),
    "seq_len": at_least(2),
    "batch_size": at_least(1),
    "num_train_steps": at_least(1),
    "seed": integer(),
    "grad_accum_steps": at_least(1),
    "learning_rate": at_least(0.0, integer=False),
    "warmup_steps": at_least(0),
    "weight_decay": at_least(0.0, integer=False),
    "adam_b1": between(0.0, 1.0, high_open=True),
    "adam_b2": between(0.0, 1.0, high_open=True),
    "adam_eps": positive_number(),
    "max_grad_norm": at_least(0.0, integer=False),  # 0 turns clipping off
    "packing": one_of(PACKINGS),
    "eval_holdout_fraction": between(0.0, 1.0, high_open=True),
    "max_documents": at_least(0),
    "vocab_size": at_least(16),
    "tokenizer_train_documents": at_least(1),
    "log_every_steps": at_least(1),
    "eval_every_steps": at_least(1),
    "checkpoint_every_steps": at_least(1),
    "keep_checkpoints": at_least(1),
    "eval_batches": at_least(0),
    "keep_every_steps": at_least(0),
    "nonfinite": one_of(NONFINITE_POLICIES),
    "profile_num_steps": at_least(0),
    "model.num_layers": at_least(1),
    "model.hidden_size": at_least(1),
    "model.num_heads": at_least(1),
    "model.mlp_dim": at_least(1),
    "model.decoder": one_of(DECODERS),
    "model.num_decoder_layers": at_least(0),
    "model.max_positions": at_least(1),
    "model.dropout_rate": between(0.0, 1.0, high_open=True),
    "model.decoder_dropout_rate": between(0.0, 1.0, high_open=True),
    "model.attention_dropout_rate": between(0.0, 1.0, high_open=True),
    "model.decoder_attention_dropout_rate": between(0.0, 1.0, high_open=True),
    "model.mask_token_source": one_of(MASK_TOKEN_SOURCES),
    "model.relative_attention_buckets": at_least(0),
    "model.relative_attention_max_distance": at_least(1),
    "model.relative_attention_init_slope": at_least(0.0, integer=False),
    "model.decoder_relative_attention": one_of((False, True)),
    "model.dtype": one_of(tuple(DTYPES)),
    "model.remat_policy": one_of(REMAT_POLICIES),
    "model.decoder_remat_policy": one_of(REMAT_POLICIES),
    "model.attention_query_chunk": at_least(0),
    "model.lm_head_chunk": at_least(0),
    "model.layer_norm_epsilon": positive_number(),
    "model.init_std": positive_number(),
}


def _lookup(config, dotted: str):
    node = config
    for key in dotted.split("."):
        if key not in node:
            return _MISSING
        node = node[key]
    return node


_MISSING = object()


def host_memory_bytes() -> int:
    """Physical memory of this host (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _combinations(config) -> list[str]:
    """What the keys must satisfy together (checked once each key is in range)."""
    m, problems = config.model, []
    k = num_masked(config.mask_rate, config.seq_len)
    if not 1 <= k < config.seq_len:
        problems.append(
            f"mask_rate={config.mask_rate} with seq_len={config.seq_len} masks k={k} slots; "
            "k must be between 1 and seq_len - 1"
        )
    if config.seq_len > m.max_positions:
        problems.append(
            f"seq_len={config.seq_len} exceeds model.max_positions={m.max_positions}; "
            "use seq_len <= max_positions"
        )
    if config.mlm_mask_prob + config.mlm_random_prob > 1.0:
        problems.append(
            f"mlm_mask_prob + mlm_random_prob = {config.mlm_mask_prob + config.mlm_random_prob}"
            " exceeds 1"
        )
    if config.batch_size % config.grad_accum_steps:
        problems.append(
            f"grad_accum_steps={config.grad_accum_steps} must divide batch_size={config.batch_size}"
        )
    if m.hidden_size % m.num_heads:
        problems.append(
            f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}"
        )
    if config.objective == "mae_lm" and m.num_decoder_layers < 1:
        problems.append(
            f"model.num_decoder_layers={m.num_decoder_layers}; objective 'mae_lm' needs >= 1"
        )
    if not m.relative_attention_buckets:
        for key in ("relative_attention_init_slope", "decoder_relative_attention"):
            if m[key]:
                problems.append(
                    f"model.{key}={m[key]!r} needs the relative bias; set "
                    "model.relative_attention_buckets > 0"
                )
    # One batch of token ids (int32) is built on a host: refuse what no host can hold
    # before anything tries to allocate it.
    batch_bytes, memory = config.batch_size * config.seq_len * 4, host_memory_bytes()
    if memory and batch_bytes > memory // 4:
        problems.append(
            f"batch_size={config.batch_size} with seq_len={config.seq_len} needs "
            f"{batch_bytes / 2**30:.1f} GiB of host memory per batch of token ids; this host "
            f"has {memory / 2**30:.1f} GiB: use a batch_size of at most "
            f"{memory // 4 // (config.seq_len * 4)}"
        )
    return problems


def validate(config: ml_collections.ConfigDict) -> None:
    """Checks every key's range and how keys combine, up front and before any device or data
    is touched; one ConfigError lists every value that is not allowed."""
    problems = []
    for key, rule in RULES.items():
        value = _lookup(config, key)
        if value is not _MISSING and not rule.ok(value):
            problems.append(f"{key}={value!r} is not allowed; it must be {rule.allowed}")
    if not problems:
        problems = _combinations(config)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} config values are not allowed: " + "; ".join(problems))


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
        relative_attention_init_slope=m.relative_attention_init_slope,
        decoder_relative_attention=m.decoder_relative_attention,
        dtype=DTYPES[m.dtype],
        scan_layers=m.scan_layers,
        remat_policy=m.remat_policy,
        decoder_remat_policy=m.decoder_remat_policy,
        attention_query_chunk=m.attention_query_chunk,
        lm_head_chunk=m.lm_head_chunk,
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


# --- The data side: what documents, packing, the input pipeline and the tokenizer read. ---


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data keys of the run's config, frozen; paths already through `paths.resolve`
    (`file://` URLs become local paths, gs:// stays)."""

    dataset: str
    data_dir: str | None  # None: TFDS's default
    train_split: str
    eval_split: str
    eval_holdout_fraction: float
    max_documents: int
    seq_len: int
    batch_size: int  # global rows per step
    eval_batches: int
    seed: int
    vocab_path: str | None
    vocab_size: int
    tokenizer_train_documents: int


def data_config(config: ml_collections.ConfigDict | DataConfig) -> DataConfig:
    """Freezes the data keys of `config`; a DataConfig passes through unchanged, so the data
    modules' entry points accept either and read only the frozen fields inside."""
    if isinstance(config, DataConfig):
        return config
    return DataConfig(
        dataset=config.dataset,
        data_dir=paths.resolve(config.data_dir) if config.data_dir else None,
        train_split=config.train_split,
        eval_split=config.eval_split,
        eval_holdout_fraction=config.eval_holdout_fraction,
        max_documents=config.max_documents,
        seq_len=config.seq_len,
        batch_size=config.batch_size,
        eval_batches=config.eval_batches,
        seed=config.seed,
        vocab_path=paths.resolve(config.vocab_path) if config.vocab_path else None,
        vocab_size=config.vocab_size,
        tokenizer_train_documents=config.tokenizer_train_documents,
    )
