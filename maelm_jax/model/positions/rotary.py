"""Rotary position embeddings and the local attention window, both at original positions.

The modern backbone (configs/base.py, `model.backbone`) has no position table: each layer
rotates its queries and keys by their tokens' positions (RoFormer; HuggingFace ModernBERT's
`rotate_half` layout, so an export needs no permutation). A score then depends on the two
tokens' distance only, so a kept token that MAE-LM or 3ML gathered out of the sequence
rotates exactly as it would in the full sequence, and its scores with the other kept tokens
are the full sequence's: the positions passed in are the original ones (`visible_idx`),
never the index in the shortened sequence.

The local window is the same idea for the mask: a local layer's query sees keys within
`local_attention // 2` original positions (HF: |i - j| <= local_attention // 2), computed
from the positions, so a gathered sequence keeps exactly the window of the full one. For
MLM that is a band; for the gathered encoders it depends on which tokens were kept, so it is
one more term of the dense mask on the XLA path and costs what a global layer costs (no
block skipping). Which layers are global is data too (`is_global`, from the layer index), so
one scanned layer serves both kinds.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


def inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
    """[head_dim // 2] float32, as HF computes them: 1 / theta ** (2i / head_dim)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


@flax.struct.dataclass
class Rotations:
    """cos and sin of every position's angles, [B|1, T, head_dim // 2] float32, for the
    global and the local layers' bases; a layer picks its pair with `for_layer`."""

    global_cos: jax.Array
    global_sin: jax.Array
    local_cos: jax.Array
    local_sin: jax.Array

    def for_layer(self, is_global) -> tuple[jax.Array, jax.Array]:
        if isinstance(is_global, bool):
            return (
                (self.global_cos, self.global_sin)
                if is_global
                else (self.local_cos, self.local_sin)
            )
        cos = jnp.where(is_global, self.global_cos, self.local_cos)
        sin = jnp.where(is_global, self.global_sin, self.local_sin)
        return cos, sin


def rotations(positions, head_dim: int, theta_global: float, theta_local: float) -> Rotations:
    """positions [B|1, T] int (original positions) -> `Rotations`, made once per layer stack."""
    angles = lambda theta: (
        positions[..., None].astype(jnp.float32) * inverse_frequencies(theta, head_dim)
    )
    global_angles, local_angles = angles(theta_global), angles(theta_local)
    return Rotations(
        jnp.cos(global_angles), jnp.sin(global_angles), jnp.cos(local_angles), jnp.sin(local_angles)
    )


def rotate(x, cos, sin):
    """x [B, T, N, H] rotated by (cos, sin) [B|1, T, H/2]: HF's `x * cos + rotate_half(x) *
    sin`, in float32 and back to x's dtype."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


@flax.struct.dataclass
class Window:
    """A local layer's window: keys within `half` original positions of the query, unless
    `is_global` (a bool, or a traced one in a scanned stack) lifts it."""

    query_positions: jax.Array  # [B|1, T] int
    key_positions: jax.Array  # [B|1, S] int
    is_global: jax.Array | bool
    half: int = flax.struct.field(pytree_node=False, default=64)
    # queries per block of the blocked local path (attention._attend_local)
    block: int = flax.struct.field(pytree_node=False, default=128)

    def mask(self) -> jax.Array:
        """[B|1, 1, T, S] bool: True where the key is inside the window (or the layer is
        global)."""
        distance = jnp.abs(self.query_positions[:, :, None] - self.key_positions[:, None, :])
        return ((distance <= self.half) | self.is_global)[:, None]


def is_global_layer(layer_index, every_n: int):
    """ModernBERT's layout: layer i is global iff i % every_n == 0."""
    return layer_index % every_n == 0
