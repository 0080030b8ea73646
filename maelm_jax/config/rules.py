"""Every config key's allowed values, in one table: what `configdict.validate` checks
first, one key at a time, before it checks how the keys combine."""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from maelm_jax.config.run_config import (
    ATTENTION_DROPOUT_IMPLS,
    ATTENTION_IMPLS,
    BACKBONES,
    DECODERS,
    DROPOUT_RNG_IMPLS,
    DTYPES,
    EMBEDDING_GRADS,
    MASK_TOKEN_SOURCES,
    NONFINITE_POLICIES,
    OBJECTIVES,
    PACKINGS,
    RELATIVE_BIAS_GRADS,
    RELATIVE_BIAS_IMPLS,
    TABLE_GATHERS,
)

# What a layer stack keeps for the backward pass (model/remat.py maps each name but "none",
# which applies no remat, to a policy): named here, under the model, so the rules and the
# model read one list.
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_but_query")


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
    "dropout_rng_impl": one_of(DROPOUT_RNG_IMPLS),
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
    "model.relative_attention_init_cap": at_least(0.0, integer=False),
    "model.decoder_relative_attention": one_of((False, True)),
    "model.decoder_relative_attention_init_slope": at_least(0.0, integer=False),
    "model.dtype": one_of(tuple(DTYPES)),
    "model.remat_policy": one_of(REMAT_POLICIES),
    "model.decoder_remat_policy": one_of(REMAT_POLICIES),
    "model.attention_query_chunk": at_least(0),
    "model.lm_head_chunk": at_least(0),
    "model.attention_impl": one_of(ATTENTION_IMPLS),
    "model.attention_dropout_impl": one_of(ATTENTION_DROPOUT_IMPLS),
    "model.float32_attention_logits": one_of((False, True)),
    "model.relative_bias_once": one_of((False, True)),
    "model.relative_bias_grad": one_of(RELATIVE_BIAS_GRADS),
    "model.relative_bias_impl": one_of(RELATIVE_BIAS_IMPLS),
    "model.gather_embedding_table": one_of(TABLE_GATHERS),
    "model.layer_norm_epsilon": positive_number(),
    "model.init_std": positive_number(),
    "model.backbone": one_of(BACKBONES),
    "model.rope_theta_global": positive_number(),
    "model.rope_theta_local": positive_number(),
    "model.local_attention": at_least(2),
    "model.global_attention_every_n_layers": at_least(1),
    "model.local_attention_block": at_least(1),
    "model.scan_unroll": at_least(0),
    "model.encoder_length_multiple": at_least(0),
    "model.embedding_grad": one_of(EMBEDDING_GRADS),
}
