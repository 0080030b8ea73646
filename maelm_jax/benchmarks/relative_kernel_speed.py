"""The relative-bias kernel (model/kernels/relative_flash.py) against cuDNN at mae_lm_base's
encoder shape (batch 64, 12 heads, 435 kept of 512 tokens, 64 buckets, dropout 0.1): one
attention layer forward and backward, the table's gradient included, each jitted alone
(median of 20 calls). The cuDNN rows are bias_speed.py's, rerun in the same process: the
layer as shipped (given the stack's [B, N, T, S] bias; making it once per step and summing
its gradient over the layers into the table happen outside the layer and are not in the
row) and the layer without a bias. Then the kernel's block sizes and warps, the kernel
with its table gradient left unsummed (what the per-bucket sums cost), and its forward
pass alone.

Usage (from the checkout's root): python -m maelm_jax.benchmarks.relative_kernel_speed
OUTDIR [BATCH]
"""

import json
import sys
import time

import jax
import jax.numpy as jnp

from maelm_jax.benchmarks import layer_bench
from maelm_jax.benchmarks.layer_bench import H, K, N, T, median_ms
from maelm_jax.model.attention import AttentionOptions, attend
from maelm_jax.model.kernels import relative_flash
from maelm_jax.model.kernels.cudnn import COMPILER_OPTIONS
from maelm_jax.model.positions import relative_bias as rb


def main(out: str, batch: int) -> None:
    """Times every row at `batch`, rewriting OUT/relative_kernel_speed.json after each."""
    B, edges, zero, keys, positions, table = layer_bench.inputs(batch)
    q, k, v = (jax.random.normal(keys[3 + i], (B, T, N, H), jnp.bfloat16) for i in range(3))
    rng = keys[6]
    results = {}

    def padded(x, multiple, fill=0):
        """x [B, T, ...] padded along T, as the model pads the kept tokens once before its
        encoder (model.encoder_length_multiple: 64 for this kernel, 8 for cuDNN)."""
        widths = [(0, 0)] * x.ndim
        widths[1] = (0, -T % multiple)
        return jnp.pad(x, widths, constant_values=fill)

    def layer(impl, dropout=True, blocks=(64, 64), warps=4):
        """One encoder layer's attention, forward and backward, as `attend` runs it in the
        model; "cudnn" takes the stack's [B, N, T, S] bias made once outside, as bias_speed.py's
        "layer as shipped" row."""
        multiple = 64 if impl == "triton" else 8
        segs = padded(jnp.ones((B, T), jnp.int32), multiple, -1)
        pos = padded(positions, multiple)
        if impl == "triton":
            options = AttentionOptions(relative_bias_impl="triton")
        else:
            options = AttentionOptions(impl="cudnn", dropout_impl="cudnn")

        def loss(q, k, v, bias):
            if impl == "triton" and (blocks, warps) != ((64, 64), 4):
                seed = jax.random.bits(rng, (), jnp.uint32)
                out = relative_flash.relative_attention(
                    q, k, v, (segs, segs), (pos, pos), bias, seed, edges=edges, zero_bucket=zero,
                    rate=0.1 if dropout else 0.0, blocks=blocks, warps=warps,
                )  # fmt: skip
                return out.astype(jnp.float32).sum()
            if impl == "triton":  # the model's path: `attend`, padding and empty rows included
                bias = rb.RelativeBias(bias, pos, pos, edges, zero)
            out = attend(q, k, v, segs, segs, bias, 0.1, rng if dropout else None, 0, options)
            return out.astype(jnp.float32).sum()

        grad = jax.grad(loss, argnums=(0, 1, 2) if impl == "cudnn, no bias" else (0, 1, 2, 3))
        qkv = [padded(x, multiple) for x in (q, k, v)]
        if impl == "triton":
            return grad, (*qkv, table)
        dense = rb.RelativeBias(table, pos, pos, edges, zero).dense(jnp.bfloat16)
        return grad, (*qkv, None if impl == "cudnn, no bias" else dense)

    def layer_forward(q, k, v, table):
        segs = padded(jnp.ones((B, T), jnp.int32), 64, -1)
        pos = padded(positions, 64)
        seed = jax.random.bits(rng, (), jnp.uint32)
        return relative_flash.relative_attention(
            q, k, v, (segs, segs), (pos, pos), table, seed, edges=edges, zero_bucket=zero, rate=0.1
        )

    def timed(name, fn, *args, reps=20):
        f = jax.jit(fn, compiler_options=COMPILER_OPTIONS)
        try:
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            compile_s = time.perf_counter() - start
            ms = median_ms(f, args, reps)
        except Exception as e:  # one failing form must not hide the others
            print(f"{name:56s} FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
            return
        print(f"{name:56s} {ms:9.3f} ms  (first call {compile_s:.1f} s)", flush=True)
        results[name] = ms
        with open(f"{out}/relative_kernel_speed.json", "w") as f:
            json.dump({"shape": [B, N, T, T], "buckets": K, "ms": results}, f, indent=1)

    for name, impl, dropout, blocks, warps in [
        ("triton layer fwd+bwd, dropout 0.1 (as the model runs it)", "triton", True, (64, 64), 4),
        ("triton layer fwd+bwd, no dropout", "triton", False, (64, 64), 4),
        ("cuDNN layer as shipped, bias [B,N,T,S], fwd+bwd", "cudnn", True, None, None),
        ("cuDNN layer, no bias, fwd+bwd", "cudnn, no bias", True, None, None),
        ("triton, 8 warps", "triton", True, (64, 64), 8),
        ("triton, blocks 32 x 64", "triton", True, (32, 64), 4),
        ("triton, blocks 64 x 32", "triton", True, (64, 32), 4),
        ("triton, blocks 32 x 32", "triton", True, (32, 32), 4),
    ]:
        grad, args = layer(impl, dropout, blocks, warps)
        timed(name, grad, *args)
    grad, args = layer("triton")
    relative_flash._TABLE_GRADIENT = False
    timed("triton layer fwd+bwd, table gradient not summed", grad, *args)
    relative_flash._TABLE_GRADIENT = True

    timed("triton layer forward only", layer_forward, *args)


if __name__ == "__main__":
    main(*layer_bench.arguments(sys.argv))
