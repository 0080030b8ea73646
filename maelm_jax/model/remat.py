"""What a layer stack keeps for the backward pass: the remat policies and the saved values.

A TPU lays out a saved activation for the matmuls that read it in the backward pass (the
weight gradients contract over the tokens): a token axis goes minor, padded to a multiple
of 128 lanes. With [B, T, ...] arrays that is T or the rows per chip, whichever pads less.
MAE-LM large's encoder sees T = 435 of 512 tokens, so at 320 rows per chip every saved
[layers, B, 435, 1024] stack took the bytes of [layers, B, 512, 1024] (v5p-64,
mae_lm_large: 92.63 GiB per chip at batch 10240, against 67.94 at 8192 where the 256 rows
per chip went minor unpadded). Where T is not a multiple of 128, the saved [B, T, E]-sized
values are therefore kept token-major, [B * T, F] (`saved`), and so is the carry between
layers (transformer.apply_layers): B * T = 139200 pads by 64. Where T is a multiple of 128
(MLM's 512, 3ML's 256) nothing pads and the reshapes only cost copies (mlm_large at batch
10528 no longer fit), so arrays stay [B, T, ...]. The MLP's hidden layer stays [B, T, M]
in every case: flattened, its float32 GELU derivative was materialised, 2 GiB per chip at
256 rows, instead of fused. With this, mae_lm_large's largest v5p-64 batch went from 10208
to 11008 (mlm_large: 10528).
"""

import jax
from jax.ad_checkpoint import checkpoint_name

from maelm_jax.config.rules import REMAT_POLICIES

# A block's weight-matmul outputs, by the names attention.py and transformer.Mlp give them.
MATMUL_OUTPUTS = ("query", "key", "value", "attention_out", "mlp_hidden", "mlp_out")

# Every name of REMAT_POLICIES but "none" (no remat at all), checked below: a name a config
# may give must have a policy here, or a run would fail only when it builds its model.
POLICIES = {
    "full": None,  # save nothing, recompute the whole block
    # Every weight matmul's output (the attention's own matmuls are recomputed in query
    # blocks either way, attention.py).
    "dots_saveable": jax.checkpoint_policies.save_only_these_names(*MATMUL_OUTPUTS),
    # The same but the query projection, recomputed in the backward pass from the layer's
    # input: one E x E matmul per token, about 2% more executed FLOPs for a large model, for
    # one saved [B, T, E] per layer less. Keys and values are read by every query block and
    # cost twice as much to recompute.
    "dots_but_query": jax.checkpoint_policies.save_only_these_names(
        *(name for name in MATMUL_OUTPUTS if name != "query")
    ),
}
if set(POLICIES) != set(REMAT_POLICIES) - {"none"}:
    raise ImportError(f"remat POLICIES {sorted(POLICIES)} do not match REMAT_POLICIES")


LANES = 128  # a TPU's minor-axis tile


def token_major(x: jax.Array) -> bool:
    """Whether [B, T, ...] `x` is saved as [B * T, ...]: T would pad on a TPU."""
    return x.shape[1] % LANES != 0


def saved(x: jax.Array, name: str) -> jax.Array:
    """`x` [B, T, ...] named `name` for the policies; token-major when `token_major(x)`."""
    if not token_major(x):
        return checkpoint_name(x, name)
    tokens = checkpoint_name(x.reshape(x.shape[0] * x.shape[1], -1), name)
    return tokens.reshape(x.shape)
