"""The edge between `ml_collections.ConfigDict` and the code: validation, then freezing.

The user's format is a ConfigDict (configs/*.py, `--config.key=value`); the code's is the
frozen `run_config.RunConfig`. Each command calls `freeze` right after parsing its flags,
so every value is checked once, up front, with a message that names it, and nothing
below the commands ever reads a ConfigDict. This module, the defaults it completes an old
checkpoint's config from (`defaults.py`) and the commands are the only importers of
`ml_collections` in the package (tests/test_layering.py holds that).
"""

import json
import os
from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import logging

from maelm_jax.config import defaults, paths
from maelm_jax.config.rules import RULES
from maelm_jax.config.run_config import (
    DTYPES,
    CheckpointConfig,
    ConfigError,
    DataConfig,
    LoopConfig,
    MaskingSettings,
    MeshConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    num_masked,
    padded_vocab_size,
)


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
    if m.backbone == "modern":
        problems += _modern_combinations(m)
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


def _modern_combinations(m) -> list[str]:
    """The modern backbone has rotary positions and no relative bias (model/positions/rotary.py)."""
    problems = []
    if m.relative_attention_buckets:
        problems.append(
            f"model.relative_attention_buckets={m.relative_attention_buckets} with "
            "model.backbone='modern': rotary positions replace the relative bias; set it to 0"
        )
    if (m.hidden_size // m.num_heads) % 2:
        problems.append(
            f"model.backbone='modern' rotates pairs of head dimensions: head dim "
            f"{m.hidden_size // m.num_heads} (hidden_size / num_heads) must be even"
        )
    if m.local_attention % 2:
        problems.append(
            f"model.local_attention={m.local_attention} must be even: a query sees "
            "local_attention // 2 positions on either side, as in HuggingFace's ModernBERT"
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


def _pairs(node) -> tuple:
    return tuple((str(k), int(v)) for k, v in sorted(dict(node).items()))


def _rules(rules) -> tuple:
    """Axis rules as tuples all the way down (JSON brings them back as lists)."""
    return tuple(
        (name, target if target is None or isinstance(target, str) else tuple(target))
        for name, target in rules
    )


def freeze(config: ml_collections.ConfigDict) -> RunConfig:
    """Validates `config` and freezes it into the `RunConfig` everything below the commands
    takes; the one reader of a ConfigDict's values."""
    validate(config)
    m = config.model
    shared = {"seq_len": config.seq_len, "batch_size": config.batch_size, "seed": config.seed}
    return RunConfig(
        objective=config.objective,
        **shared,
        model=ModelConfig(
            objective=config.objective,
            vocab_size=padded_vocab_size(config.vocab_size),
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
            relative_attention_init_cap=m.relative_attention_init_cap,
            decoder_relative_attention=m.decoder_relative_attention,
            decoder_relative_attention_init_slope=m.decoder_relative_attention_init_slope,
            dtype=DTYPES[m.dtype],
            scan_layers=m.scan_layers,
            remat_policy=m.remat_policy,
            decoder_remat_policy=m.decoder_remat_policy,
            attention_query_chunk=m.attention_query_chunk,
            lm_head_chunk=m.lm_head_chunk,
            layer_norm_epsilon=m.layer_norm_epsilon,
            init_std=m.init_std,
            attention_impl=m.attention_impl,
            attention_dropout_impl=m.attention_dropout_impl,
            float32_attention_logits=m.float32_attention_logits,
            relative_bias_once=m.relative_bias_once,
            relative_bias_grad=m.relative_bias_grad,
            relative_bias_impl=m.relative_bias_impl,
            gather_embedding_table=m.gather_embedding_table,
            backbone=m.backbone,
            rope_theta_global=float(m.rope_theta_global),
            rope_theta_local=float(m.rope_theta_local),
            local_attention=m.local_attention,
            global_attention_every_n_layers=m.global_attention_every_n_layers,
            local_attention_block=m.local_attention_block,
            scan_unroll=m.scan_unroll,
            encoder_length_multiple=m.encoder_length_multiple,
            embedding_grad=m.embedding_grad,
        ),
        masking=MaskingSettings(
            objective=config.objective,
            mask_rate=config.mask_rate,
            seq_len=config.seq_len,
            num_masked=num_masked(config.mask_rate, config.seq_len),
            mlm_mask_prob=config.mlm_mask_prob,
            mlm_random_prob=config.mlm_random_prob,
            packing=config.packing,
        ),
        data=DataConfig(
            dataset=config.dataset,
            data_dir=paths.resolve(config.data_dir) if config.data_dir else None,
            train_split=config.train_split,
            eval_split=config.eval_split,
            eval_holdout_fraction=config.eval_holdout_fraction,
            max_documents=config.max_documents,
            eval_batches=config.eval_batches,
            vocab_path=paths.resolve(config.vocab_path) if config.vocab_path else None,
            vocab_size=config.vocab_size,
            tokenizer_train_documents=config.tokenizer_train_documents,
            **shared,
        ),
        optimizer=OptimizerConfig(
            learning_rate=config.learning_rate,
            warmup_steps=config.warmup_steps,
            num_train_steps=config.num_train_steps,
            weight_decay=config.weight_decay,
            adam_b1=config.adam_b1,
            adam_b2=config.adam_b2,
            adam_eps=config.adam_eps,
            max_grad_norm=config.max_grad_norm,
        ),
        loop=LoopConfig(
            num_train_steps=config.num_train_steps,
            seed=config.seed,
            grad_accum_steps=config.grad_accum_steps,
            eval_every_steps=config.eval_every_steps,
            eval_batches=config.eval_batches,
            log_every_steps=config.log_every_steps,
            nonfinite=config.nonfinite,
            profile_num_steps=config.profile_num_steps,
            profile_start_step=config.profile_start_step,
            peak_flops_per_device=config.peak_flops_per_device,
            inject_nan_at_step=config.inject_nan_at_step,
            init_from=config.init_from or None,
            dropout_rng_impl=config.dropout_rng_impl,
        ),
        checkpoint=CheckpointConfig(
            every_steps=config.checkpoint_every_steps,
            keep=config.keep_checkpoints,
            keep_every_steps=config.keep_every_steps,
        ),
        mesh=MeshConfig(
            ici=_pairs(config.mesh.ici),
            dcn=_pairs(config.mesh.dcn),
            logical_axis_rules=_rules(config.logical_axis_rules),
        ),
        source_json=config.to_json_best_effort(sort_keys=True),
    )


def _set(config: ml_collections.ConfigDict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        node = node[key]
    if leaf not in node:
        raise ConfigError(f"override {dotted}={value!r}: the config has no key {dotted!r}")
    node[leaf] = value


def override(run: RunConfig, changes: Mapping[str, Any]) -> RunConfig:
    """`run` with dotted keys changed ({"batch_size": 64, "model.scan_layers": False}), then
    validated and frozen again, so every part that copies a changed key sees the change."""
    config = ml_collections.ConfigDict(json.loads(run.source_json))
    for dotted, value in changes.items():
        _set(config, dotted, value)
    return freeze(config)


# What the model did before each of these keys existed, for checkpoints written before it.
_BEFORE_KEY_EXISTED = {
    "attention_dropout_rate": 0.0,
    "decoder_attention_dropout_rate": 0.0,
    "mask_token_source": "learned",
    "attention_impl": "xla",
    "float32_attention_logits": True,
    "relative_bias_once": False,
    "gather_embedding_table": "never",
    "backbone": "roberta",
    # The modern backbone's keys: unread by "roberta", the only backbone before them.
    "rope_theta_global": 160_000.0,
    "rope_theta_local": 10_000.0,
    "local_attention": 128,
    "global_attention_every_n_layers": 3,
    "local_attention_block": 128,
    "scan_unroll": 1,
    "encoder_length_multiple": 0,  # the compute's shape, not the model: the platform's pick
    "embedding_grad": "compute_dtype",
    "attention_dropout_impl": "xla",
    "relative_bias_grad": "per_layer",
    "relative_bias_impl": "dense",
}


# Keys that were booleans before they took names: {key: {old value: its name now}}.
_BEFORE_KEY_TOOK_STRINGS = {"gather_embedding_table": {False: "never", True: "always"}}


def from_checkpoint(saved: dict) -> RunConfig:
    """The RunConfig a checkpoint's stored config (JSON) describes, completed for keys added
    since it was written: model keys get what the model did before (`_BEFORE_KEY_EXISTED`;
    any other missing model key is a ConfigError), top-level keys (training-only: data,
    optimizer, logging) their defaults (`defaults.py`); a key that was a boolean before it
    took names gets the name of what it did (`_BEFORE_KEY_TOOK_STRINGS`)."""
    model = dict(saved.get("model", {}))
    for key, names in _BEFORE_KEY_TOOK_STRINGS.items():
        if isinstance(model.get(key), bool):
            model[key] = names[model[key]]
    saved = {**saved, "model": model}
    config, current = ml_collections.ConfigDict(saved), defaults.get_config()
    absent = [k for k in current.model if k not in config.model]
    unknown = [k for k in absent if k not in _BEFORE_KEY_EXISTED]
    if unknown:
        raise ConfigError(f"the checkpoint's config lacks model keys {unknown}")
    for key in absent:
        config.model[key] = _BEFORE_KEY_EXISTED[key]
    if absent:
        logging.warning("Checkpoint config predates model keys %s; using what runs did", absent)
    for key in current:
        if key not in config:
            config[key] = current[key]
    return freeze(config)
