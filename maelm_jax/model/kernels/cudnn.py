"""Attention through cuDNN's fused (flash) kernel on NVIDIA GPUs, for every attention the
layers have without dropout: document segments, a local window, an additive relative bias.

`cudnn_attend` is `attention._attend_block` on a GPU: the same inputs, the same result
(tests/test_cudnn_attention.py passed on an H200), without the [B, N, T, S] scores and
probabilities that the XLA path writes to memory and keeps for the backward pass. Those
made modern_mlm_base at 32 x 1024 ask an H200 for 104.6 GiB; through the kernel it peaked
at 14.0 GiB (docs/results.md).

What the kernel does not do for us, and this module does:

- Masks. cuDNN takes an additive bias, not segment ids: the segment (and window) mask
  becomes a [B, 1, T, S] bias of 0 / a large negative number, added to the relative bias
  where there is one (jax's cuDNN binding does this for a boolean mask).
- Odd lengths. With a bias cuDNN trains only even lengths, and MAE-LM's encoder sees 435
  of 512 tokens: both sequences pad to a multiple of 8, padded keys masked out, padded
  queries sliced off.
- A query whose segment has no key gets the zeros `_attend_block` gives: the caller zeroes
  such rows.

Dropout is not here. jax's public `dot_product_attention` takes none; its private binding
(`fused_attention_stablehlo`) does, and on an H200 with jax 0.11.2 its mask was new at every
call and the same in both passes, but XLA aborted (`cuda_dnn.cc: Check failed:
local_device_ordinal.has_value()`, recording the cuDNN graph into a command buffer) as soon
as such a call sat in a loop or a train step. Its mask also comes from cuDNN's own counter,
not the step's key, so no resume would be exact. Attention with dropout therefore stays on
the XLA path (`AttentionOptions.fused`).
"""

import jax
import jax.numpy as jnp
import numpy as np

# Lengths pad to this multiple (cuDNN trains with a bias only at even lengths).
LENGTH_MULTIPLE = 8


def cudnn_attend(q, k, v, mask, bias):
    """q [B, T, N, H], k and v [B, S, N, H] in bf16/fp16, mask bool [B|1, 1, T, S] (True:
    the key is visible), bias [B|1, N|1, T, S] or None -> [B, T, N, H]."""
    t, s = q.shape[1], k.shape[1]
    pad_t, pad_s = -t % LENGTH_MULTIPLE, -s % LENGTH_MULTIPLE
    if pad_t or pad_s:
        q = _pad(q, 1, pad_t)
        k, v = _pad(k, 1, pad_s), _pad(v, 1, pad_s)
        mask = _pad(_pad(mask, 2, pad_t), 3, pad_s)  # padded keys: False, never seen
        bias = None if bias is None else _pad(_pad(bias, 2, pad_t), 3, pad_s)
    if bias is not None:
        bias = bias.astype(q.dtype)
    scale = float(1.0 / np.sqrt(q.shape[-1]))
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, mask=mask, scale=scale, implementation="cudnn"
    )
    return out[:, :t]


def _pad(x, axis: int, amount: int):
    if not amount:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, amount)
    return jnp.pad(x, widths)
