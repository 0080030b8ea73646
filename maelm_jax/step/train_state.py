"""The train state, built abstractly first so it can be sharded before it exists.

`abstract_state` (shapes plus logical axis names, no memory) feeds three consumers: the
sharded initialisation, ahead-of-time compilation for a TPU topology, and checkpoint
restore. Parameters and optimizer moments are therefore born sharded: no host ever holds
the full model.
"""

from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.model.masked_lm import init_inputs


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: updates attempted so far
    params: Any
    opt_state: Any
    skipped_updates: jax.Array  # int32 scalar: updates dropped for a non-finite loss/grad


def make_init_fn(
    model: nn.Module, tx: optax.GradientTransformation, model_cfg: ModelConfig, seq_len: int, k: int
) -> Callable[[jax.Array], TrainState]:
    """rng -> TrainState with logically-boxed leaves (see `nn.get_partition_spec`)."""

    def init(rng):
        params = model.init(rng, *init_inputs(seq_len, k))["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            skipped_updates=jnp.zeros((), jnp.int32),
        )

    return init


def abstract_state(init_fn) -> TrainState:
    """Shapes, dtypes and logical boxes of the state; allocates and runs nothing (the key is
    traced too, so this works on compile-only TPU devices)."""
    return jax.eval_shape(lambda: init_fn(jax.random.PRNGKey(0)))


def logical_specs(boxed_state: TrainState) -> TrainState:
    """Logical PartitionSpec per leaf; unboxed leaves (step, optimizer counts) get P()."""
    return nn.get_partition_spec(boxed_state)


def _strip_boxes(tree):
    """The values inside logical boxes, without applying their sharding constraints (which
    fail on ShapeDtypeStructs when a mesh is active)."""
    return jax.tree_util.tree_map(
        lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.LogicallyPartitioned) else x,
        tree,
        is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
    )


def sharded_shapes(boxed_state: TrainState, shardings) -> TrainState:
    """ShapeDtypeStructs that carry their NamedSharding: input to AOT lowering and restore."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        _strip_boxes(boxed_state),
        shardings,
    )


def initialize(init_fn, rng: jax.Array, shardings) -> TrainState:
    """Runs `init_fn` as one jitted program whose outputs land directly in `shardings`."""
    return jax.jit(lambda r: nn.meta.unbox(init_fn(r)), out_shardings=shardings)(rng)
