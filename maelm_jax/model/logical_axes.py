"""The model's logical axis vocabulary: the only sharding names model code may use.

Parameters and activations use separate names (MaxText's convention) so a rule like
`embed -> fsdp` shards weights without also fighting `activation_batch -> (data, fsdp)` for
the same mesh axis inside one activation. The mapping to mesh axes is config data
(`config.logical_axis_rules`); `sharding.py` checks that every name below has a rule.
"""

import flax.linen as nn

PARAM_AXES = ("vocab", "embed", "mlp", "heads", "kv", "position", "relpos_buckets", "layers")
ACTIVATION_AXES = (
    "activation_batch",
    "activation_length",
    "activation_embed",
    "activation_heads",
    "activation_kv",
    "activation_mlp",
    "activation_vocab",
)
ALL_AXES = PARAM_AXES + ACTIVATION_AXES

HIDDEN = ("activation_batch", "activation_length", "activation_embed")  # [B, T, E]
HEADS = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
MLP = ("activation_batch", "activation_length", "activation_mlp")  # [B, T, M]
LOGITS = ("activation_batch", "activation_length", "activation_vocab")  # [B, k, V]


def constrain(x, axes: tuple[str, ...]):
    """Pins an activation's sharding; a name without a rule is an error, never replication.

    Outside a mesh and rules context (unit tests on one device) this is the identity.
    """
    return nn.with_logical_constraint(x, axes, fallback=nn.spmd.RulesFallback.RAISE_ERROR)


def param(init, axes: tuple[str, ...]):
    """An initializer whose parameter carries logical axis names."""
    return nn.with_logical_partitioning(init, axes)
