"""What MAE-LM's per-example relative bias costs on a GPU, piece by piece, at mae_lm_base's
encoder shape (batch 64, 12 heads, 435 kept of 512 tokens, 64 buckets).

mae_lm_base's step took 2.5x mlm_base's on an H200 (2026-11-26) for 0.95x its FLOPs; the
bias is what its encoder has and mlm_base's lacks. This times, each jitted alone (median of
20 calls): the table gradient's contraction as the model writes it and in other forms, the
bias made once (the forward contraction), and one cuDNN attention layer (forward and
backward, dropout 0.1) with a [B, N, T, S] bias, a [1, N, T, S] one and none, and the
bias's roll (forward and backward) as jnp.roll and as cudnn.roll (a roll back for its
gradient) with jnp.roll's concatenate-and-slice or a gather, and the cuDNN layer with the
bias rolled as shipped (a gather, the rest as jnp.roll), with every roll a concatenation,
and with every roll but the mask's a gather; and cuDNN's kernel alone with either bias,
with and without its dbias output, and with none, to split what reading the bias costs
from what its gradient costs.

Usage (from the checkout's root): python -m maelm_jax.benchmarks.bias_speed OUTDIR [BATCH]
"""

import functools
import json
import sys

import jax
import jax.numpy as jnp

from maelm_jax.benchmarks import layer_bench
from maelm_jax.benchmarks.layer_bench import H, K, N, T, median_ms
from maelm_jax.model.kernels import cudnn
from maelm_jax.model.kernels.cudnn import COMPILER_OPTIONS, cudnn_attend, roll
from maelm_jax.model.positions import relative_bias as rb


def main(out: str, batch: int) -> None:
    """Times every form at `batch`, rewriting OUT/bias_speed.json after each."""
    B, edges, zero, keys, positions, table = layer_bench.inputs(batch)
    buckets = rb.offset_buckets(positions[:, None, :] - positions[:, :, None], edges, zero)
    cot = jax.random.normal(keys[1], (B, N, T, T), jnp.bfloat16)

    reference = jax.jit(lambda c, b: rb.table_gradient(c, b, K))(cot, buckets)

    def timed(name, fn, *args, reps=20, options=None):
        f = jax.jit(fn, compiler_options=options)
        try:
            got = jax.block_until_ready(f(*args))
            if getattr(got, "shape", None) == reference.shape and "12" not in name:
                err = float(jnp.max(jnp.abs(got - reference)) / jnp.max(jnp.abs(reference)))
                name += f" (rel err {err:.1e})"
            ms = median_ms(f, args, reps)
        except Exception as e:  # one failing form must not hide the others
            print(f"{name:48s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            return name, None
        print(f"{name:62s} {ms:9.3f} ms", flush=True)
        return name, ms

    def one_hot(b, dtype):
        return (b[..., None] == jnp.arange(K)).astype(dtype)

    def per_batch(c, b):
        g = jnp.einsum("bnts,btsk->bkn", c, one_hot(b, c.dtype), preferred_element_type=jnp.float32)
        return g.sum(0)

    def chunked(c, b, chunk=29):  # batch x query chunks of 15 queries
        c = c.reshape(B, N, chunk, T // chunk, T)
        b = b.reshape(B, chunk, T // chunk, T)
        g = jnp.einsum(
            "bncts,bctsk->bckn", c, one_hot(b, c.dtype), preferred_element_type=jnp.float32
        )
        return g.sum((0, 1))

    def masked_sum(c, b):
        hit = b[:, None, :, :, None] == jnp.arange(K)
        return jnp.where(hit, c[..., None].astype(jnp.float32), 0.0).sum((0, 2, 3)).T

    def segment(c, b):
        rows = jnp.moveaxis(c, 1, -1).reshape(-1, N).astype(jnp.float32)
        return jax.ops.segment_sum(rows, b.reshape(-1), num_segments=K)

    def layer_grads(c, b):  # twelve layers' gradients summed first, one contraction
        total = sum(c * (1.0 + i / 100) for i in range(12))
        return rb.table_gradient(total, b, K)

    def layer_grads_float32(c, b):  # the model's "summed": a float32 sum, a float32 contraction
        total = sum(c.astype(jnp.float32) * (1.0 + i / 100) for i in range(12))
        return rb.table_gradient(total, b, K)

    def twelve_contractions(c, b):
        return sum(rb.table_gradient(c * (1.0 + i / 100), b, K) for i in range(12))

    results = {}

    def record(name, fn, *args, **kwargs):
        """Times one form and rewrites the JSON, so an abort later keeps what ran."""
        results.update([timed(name, fn, *args, **kwargs)])
        with open(f"{out}/bias_speed.json", "w") as f:
            json.dump({"shape": [B, N, T, T], "buckets": K, "ms": results}, f, indent=1)

    q, k, v = (jax.random.normal(keys[3 + i], (B, T, N, H), jnp.bfloat16) for i in range(3))
    mask = jnp.ones((B, 1, T, T), bool)
    rng = keys[6]

    def attention_layer(bias):
        def loss(q, k, v, bias):
            out = cudnn_attend(q, k, v, mask, bias, dropout=(0.1, rng))
            return out.astype(jnp.float32).sum()

        return jax.grad(loss, argnums=(0, 1, 2, 3) if bias is not None else (0, 1, 2))

    for name, bias in [
        ("cuDNN layer fwd+bwd, bias [B,N,T,S]", cot),
        ("cuDNN layer fwd+bwd, bias [1,N,T,S]", cot[:1]),
        ("cuDNN layer fwd+bwd, no bias", None),
    ]:
        record(name, attention_layer(bias), q, k, v, bias, options=COMPILER_OPTIONS)

    # cuDNN's kernel alone at the padded length (440), no rolls: with the bias and its dbias
    # output, with the bias but no dbias, and with no bias. jax's binding asks for dbias whenever
    # a bias is given (jax 0.11.2 skips it only for a boolean mask alone), so a layer whose
    # gradient leaves the bias out still pays for it: these call the binding's primitive with
    # dbias off, to split what reading the bias costs the kernel from what writing its
    # gradient does.
    def kernel_alone(has_bias, has_dbias):
        from jax._src.cudnn import fused_attention_stablehlo as fas

        def loss(q, k, v, bias):
            z = jnp.zeros(0, q.dtype)
            statics = (float(H**-0.5), 42, 0.1, (has_bias, has_dbias), fas.MaskType.NO_MASK)
            layout, version = fas.AttentionLayout.BTNH.value, fas.check_cudnn_version()
            # q, k, v, bias, then q/kv seqlens and offsets and the page tables, all unused
            arrays = (q, k, v, bias if has_bias else z, *[z] * 6)
            out = fas._dot_product_attention(*arrays, *statics, layout, None, version, False)
            return out.astype(jnp.float32).sum()

        return jax.grad(loss, argnums=(0, 1, 2, 3) if has_dbias else (0, 1, 2))

    extra = -T % cudnn.LENGTH_MULTIPLE  # 435 -> 440, as the layer pads
    padded = [jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0))) for x in (q, k, v)]
    bias_full = jnp.pad(cot, ((0, 0), (0, 0), (0, extra), (0, extra)))
    for name, bias, has_dbias in [
        ("cuDNN kernel alone fwd+bwd, bias [B,N,T,S] and dbias", bias_full, True),
        ("cuDNN kernel alone fwd+bwd, bias [B,N,T,S], no dbias", bias_full, False),
        ("cuDNN kernel alone fwd+bwd, bias [1,N,T,S] and dbias", bias_full[:1], True),
        ("cuDNN kernel alone fwd+bwd, bias [1,N,T,S], no dbias", bias_full[:1], False),
        ("cuDNN kernel alone fwd+bwd, no bias", None, False),
    ]:
        grad = kernel_alone(bias is not None, has_dbias)
        record(name, grad, *padded, bias_full if bias is None else bias, options=COMPILER_OPTIONS)
    for name, gather in [
        ("every roll concatenating", False),
        ("every roll but the mask's a gather", True),
    ]:
        # `rolled` reads the module's roll when traced
        cudnn.roll = lambda x, s, a, _, g=gather: roll(x, s, a, g)
        record(
            f"cuDNN layer fwd+bwd, bias [B,N,T,S], {name}",
            attention_layer(cot),
            q,
            k,
            v,
            cot,
            options=COMPILER_OPTIONS,
        )
    cudnn.roll = roll

    # Measured on one H200, 2026-11-27 06:33 (docs/results.md): last, so a cut-off run keeps
    # the layers.
    record(
        "table_gradient (model, one layer)", lambda c, b: rb.table_gradient(c, b, K), cot, buckets
    )
    record("table_gradient x12 (model, one step)", twelve_contractions, cot, buckets)
    record("sum of 12 cotangents, one contraction", layer_grads, cot, buckets)
    record("float32 sum of 12, one float32 contraction", layer_grads_float32, cot, buckets)
    record("per-batch einsum then sum", per_batch, cot, buckets)
    record("batch x query-chunk einsum then sum", chunked, cot, buckets)
    record("masked sum (fused reduction)", masked_sum, cot, buckets)
    record("segment_sum (scatter-add)", segment, cot, buckets)
    record(
        "bias made once (_contract, bf16)",
        lambda b, t: rb._contract(b, t, jnp.bfloat16),
        buckets,
        table,
    )

    # A layer's roll of the bias and its gradient, the shifts traced as in the step.
    shifts = jax.random.randint(keys[7], (2,), 1, T)
    for name, fn in [
        ("jnp.roll", jnp.roll),
        ("cudnn.roll, concatenating", functools.partial(roll, gather=False)),
        ("cudnn.roll, gather", functools.partial(roll, gather=True)),
    ]:
        grad = jax.grad(lambda x, s, f=fn: jnp.sum(f(x, tuple(s), (2, 3)).astype(jnp.float32) ** 2))
        record(f"bias roll fwd+bwd ({name})", grad, cot, shifts)


if __name__ == "__main__":
    main(*layer_bench.arguments(sys.argv))
