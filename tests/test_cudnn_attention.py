"""cuDNN's fused attention (model/kernels/cudnn.py) against the XLA path, on a GPU: the
same values and gradients with packed documents, padding, a query with no key, an odd
length (MAE-LM's 435 kept tokens pad), a relative bias and a local window at gathered
positions.

Every test here needs an NVIDIA GPU and skips elsewhere (CI has none). They passed on an
H200 (jax 0.11.2) on 2026-11-26 (docs/results.md); `bash launch/gpu/bench.sh OUT - tests`
runs them there.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_inputs import has_gpu, inputs

from maelm_jax.model.attention import AttentionOptions, _attend_block
from maelm_jax.model.positions.rotary import Window

pytestmark = pytest.mark.skipif(not has_gpu(), reason="cuDNN's fused attention needs a GPU")

XLA, CUDNN = AttentionOptions("xla"), AttentionOptions("cudnn")


def bf16(*xs):
    return [x.astype(jnp.bfloat16) for x in xs]


@pytest.mark.parametrize("t,s,cross", [(64, 64, False), (45, 45, False), (24, 40, True)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_values_and_gradients_match_the_xla_path(t, s, cross, with_bias):
    (q, k, v, q_seg, k_seg), cotangent = inputs(t, s, cross, batch=2, heads=4, dim=64)
    q, k, v, cotangent = bf16(q, k, v, cotangent)
    bias = None
    if with_bias:
        bias = jax.random.normal(jax.random.PRNGKey(7), (2, 4, t, s), jnp.bfloat16)

    def run(options):
        def fn(q, k, v, bias):
            return _attend_block(q, k, v, q_seg, k_seg, bias, 0.0, None, options)

        out, pull = jax.vjp(fn, q, k, v, bias)
        return [out, *pull(cotangent)]

    got, want = run(CUDNN), run(XLA)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, want, strict=True):
        if b is None:
            continue
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        scale = np.abs(b).max() + 1e-6
        assert np.abs(a - b).max() <= 0.03 * scale, name
    # The query whose document has no key (cross) and the padding rows give zeros, not NaN.
    assert np.isfinite(np.asarray(got[0], np.float32)).all()


def test_local_window_matches_the_xla_path():
    (q, k, v, seg, _), _ = inputs(96, 96, False, batch=2, heads=4, dim=64)
    q, k, v = bf16(q, k, v)
    positions = jnp.broadcast_to(jnp.arange(96)[None] * 2, (2, 96))  # kept tokens: gaps
    window = Window(positions, positions, False, half=16, block=32)
    got = _attend_block(q, k, v, seg, seg, None, 0.0, None, CUDNN, window)
    want = _attend_block(q, k, v, seg, seg, None, 0.0, None, XLA, window)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=0.03)
