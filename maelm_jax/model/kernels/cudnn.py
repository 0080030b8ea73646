"""Attention through cuDNN's fused (flash) kernel on NVIDIA GPUs, for every attention the
layers have: document segments, a local window, an additive relative bias, and probability
dropout (below).

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

Dropout (`model.attention_dropout_impl="cudnn"`) goes through jax's private binding
(`fused_attention_stablehlo`; the public `dot_product_attention` takes none). cuDNN draws
the mask from its own Philox generator inside the kernel, which is what saves the [B, N, T,
S] probabilities, but the generator is not ours:

- Its seed is a compile-time constant and its offset a counter per call site, advanced at
  each execution (XLA's `CudnnGraph`): a new mask each step, the same one in the forward and
  backward passes, but not a function of the step. A resumed run starts the counter again
  and so draws other (equally random) masks than the uninterrupted one would have: with
  "cudnn", resume is exact in everything but attention dropout.
- Every layer of an unrolled stack is a call site with the same seed and counter, so every
  layer would drop the same [B, N, T, S] entries. Each call therefore rolls its queries and
  its keys by two offsets drawn from the layer's own dropout key (`rolled`; the mask
  and bias roll with them, the output rolls back): the kernel's mask entry (t, s) lands on
  the pair (t - r, s - r') of the caller's order, so two layers share a mask with
  probability 1 / (T * S). Rolls, not a batch or head permutation: those axes may be
  sharded, the sequence axes are not.
- XLA aborted recording such a call into a command buffer (`cuda_dnn.cc: Check failed:
  local_device_ordinal.has_value()`, jax 0.11.2, H200): a step with cuDNN dropout compiles
  with `COMPILER_OPTIONS`, which keep cuDNN calls out of command buffers.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.config.run_config import CUDNN_LENGTH_MULTIPLE

# Lengths pad to this multiple (cuDNN trains with a bias only at even lengths); the MAE-LM
# encoder's kept tokens arrive padded to it already (model.encoder_length_multiple).
LENGTH_MULTIPLE = CUDNN_LENGTH_MULTIPLE

# What a step whose attention drops out in cuDNN compiles with (jax.jit's compiler_options):
# command buffers for every kind of call but cuDNN's. A compile option takes a list, not the
# XLA_FLAGS form "-CUDNN" (jax 0.11.2: "not a valid enum value").
COMPILER_OPTIONS = {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"}


def cudnn_attend(q, k, v, mask, bias, dropout=None):
    """q [B, T, N, H], k and v [B, S, N, H] in bf16/fp16, mask bool [B|1, 1, T, S] (True:
    the key is visible), bias [B|1, N|1, T, S] or None, dropout None or (rate, the layer's
    dropout key) -> [B, T, N, H]."""
    if dropout is None:
        return _kernel(q, k, v, mask, bias)
    rate, rng = dropout
    return rolled(functools.partial(_kernel, dropout_rate=rate), rng, q, k, v, mask, bias)


def rolled(kernel, rng, q, k, v, mask, bias):
    """`kernel(q, k, v, mask, bias)` with its queries and keys rolled by offsets drawn from
    `rng` (the layer's dropout key), and its output rolled back: the same attention, with
    the kernel's mask entry (t, s) on another (query, key) pair per layer. The bias rolls as
    a gather, everything else as `jnp.roll` does (`roll`)."""
    query_key, key_key = jax.random.split(rng)
    r = jax.random.randint(query_key, (), 0, q.shape[1])
    r_key = jax.random.randint(key_key, (), 0, k.shape[1])
    q = roll(q, (r,), (1,), False)
    k, v = roll(k, (r_key,), (1,), False), roll(v, (r_key,), (1,), False)
    mask = jnp.roll(mask, (r, r_key), axis=(2, 3))
    if bias is not None:
        bias = roll(bias, (r, r_key), (2, 3), True)
    return roll(kernel(q, k, v, mask, bias), (-r,), (1,), False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def roll(x, shifts, axes, gather: bool):
    """`jnp.roll(x, shifts, axes)` with traced `shifts`, whose gradient is the roll back;
    `gather`: as one gather rather than `jnp.roll`'s concatenate-and-slice.

    Why a custom gradient: autodiff of `jnp.roll` transposes its concatenate-and-slice, the
    cotangent written into a zero array twice the length, cut in two halves and the halves
    added, per axis. For MAE-LM's per-example bias ([B, N, T, S] per layer) that was the bulk
    of the 69 large adds and 49 pads per mae_lm_base step on an H200
    (benchmarks/kernel_table.py, 2026-11-26: 38.9 and 9.6 of 152 ms). A roll is a
    permutation: its transpose is one roll the other way.

    Why a gather for the bias and not for the rest, measured on an H200 (2026-11-27, batch
    64 x 512, docs/results.md): with the custom gradient alone, mae_lm_base's step still
    spent 30.4 of 105.7 ms of kernels in those adds and pads, the bias's doubled copies
    forward and backward; as a gather (`_permute`), which XLA fuses with the bias's cast
    and padding forward and with the layers' gradient sum backward, one cuDNN layer with
    the bias and its rolls as gathers took 2.76 ms forward and backward instead of 4.10
    with concatenations, and the step 103.0 ms instead of 116.0. But XLA on GPU gives each
    gather a transpose of its own (72 more per step), and with the queries, keys, values,
    output and mask rolled as gathers too, mlm_base (no bias) went from 65.9 to 79.8 ms.
    Those arrays are a tenth of the bias's size and keep `jnp.roll`."""
    return _roll(x, shifts, axes, gather)


def _roll(x, shifts, axes, gather):
    return _permute(x, shifts, axes) if gather else jnp.roll(x, shifts, axes)


def _roll_fwd(x, shifts, axes, gather):
    return _roll(x, shifts, axes, gather), shifts


def _roll_bwd(axes, gather, shifts, cotangent):
    return _roll(cotangent, tuple(-s for s in shifts), axes, gather), None


def _permute(x, shifts, axes):
    """`jnp.roll(x, shifts, axes)` as one gather: entry i of each axis reads (i - shift) mod n,
    index arithmetic where `jnp.roll` with a traced shift writes the array twice over."""
    rows = jnp.ix_(
        *[(jnp.arange(x.shape[a]) - s) % x.shape[a] for s, a in zip(shifts, axes, strict=True)]
    )
    index = [slice(None)] * x.ndim
    for axis, row in zip(axes, rows, strict=True):
        index[axis] = row
    return x.at[tuple(index)].get(mode="promise_in_bounds", unique_indices=True)


roll.defvjp(_roll_fwd, _roll_bwd)


def _kernel(q, k, v, mask, bias, dropout_rate: float = 0.0):
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
    if dropout_rate:
        from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention

        out = dot_product_attention(
            q, k, v, bias=bias, mask=mask, scale=scale, dropout_rate=dropout_rate
        )
    else:
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
