"""XLA's step-time estimate for TPU slices (`aot/step_time.py`, the `compile` command's
`estimated_step_seconds`) and the step compiled with splash attention, on this CPU with
libtpu's compile-only devices. (Apart from test_compile.py so that the two modules' TPU
compiles run on both of the suite's workers; conftest.HEAVIEST_FIRST hands it out early,
since a long module handed out last holds up the end.)"""

import importlib.util

import jax
import pytest
from tiny_configs import tiny_config

from maelm_jax.aot import compile_step, step_time, topology
from maelm_jax.config import configdict
from maelm_jax.hardware import tpu_chips

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed (pip install "jax[tpu]==0.10.2"); TPU compiles need it',
)
# As in test_compile.py: dropout's random bits are about a third of a tiny step's TPU
# compile and the step-time tests are not about them; the splash test keeps them.
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0)


HLO = """
%fused_matmul (p0: f32[2,2], p1: f32[2,2]) -> f32[2,2] {
  ROOT %dot.1 = f32[2,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}
}
%matmul_body (param: (s32[], f32[2,2])) -> (s32[], f32[2,2]) {
  %mm = f32[2,2]{1,0} fusion(%x, %y), kind=kOutput, calls=%fused_matmul
}
%copy_body (param: (s32[], f32[4])) -> (s32[], f32[4]) {
  %c = f32[4]{0} copy(%x)
}
ENTRY %main (p: f32[2,2]) -> f32[2,2] {
  %w1 = (s32[], f32[2,2]) while(%t1), condition=%cond, body=%matmul_body
  %w2 = (s32[], f32[4]) while(%t2), condition=%cond, body=%copy_body
}
"""


def test_only_loops_that_reach_a_matmul_count_as_undercounting():
    assert compile_step.matmul_loops(HLO) == 1


def _estimated_and_deep(run):
    """(step_time.estimate on v5p-8, the whole unrolled step's own estimate, its HLO)."""
    devices = topology.topology_devices(tpu_chips.parse("v5p-8"))
    whole, _, _, _ = compile_step.compile_step(
        compile_step.counting_config(run), devices, step_time.OPTIONS
    )
    direct = compile_step.estimated_seconds(compile_step.costs(whole))
    return step_time.estimate(run, devices), direct, whole.as_text()


@needs_libtpu
def test_step_time_from_shallow_programs_is_the_deep_unrolled_programs():
    """Four shallow programs, extrapolated, against the whole unrolled step. The modern
    encoder's layers (global, local, local, global, local) cost differently once the local
    ones run blocked (at this tiny size the blocks' overhead makes a local layer the dearer),
    so one program prices a second encoder layer (a local one), one a global layer, and one
    a second decoder layer. One step holds all three extrapolations: five compiles, where
    an encoder-only modern step and a classic step with a decoder took eight."""
    modern = dict(backbone="modern", local_attention=4, local_attention_block=4, **NO_DROPOUT)
    run = configdict.freeze(tiny_config(num_layers=5, num_decoder_layers=2, **modern))
    estimated, direct, hlo = _estimated_and_deep(run)
    assert estimated.encoder_layer_seconds > 0 and estimated.decoder_layer_seconds > 0
    assert estimated.global_layer_seconds > 0
    assert estimated.global_layer_seconds != pytest.approx(estimated.encoder_layer_seconds)
    assert estimated.seconds == pytest.approx(direct, rel=0.02)
    # The counting step's attention is on the XLA path: no kernel hides work from the clock
    # (the splash test below holds the kernel's side).
    assert "tpu_custom_call" not in hlo
    with pytest.raises(step_time.Unavailable, match="cpu compiler has no cost model of time"):
        step_time.estimate(run, jax.devices("cpu")[:1])


@needs_libtpu
def test_the_step_compiles_for_tpu_with_splash_where_no_bias_or_dropout_needs_xla():
    """attention_impl "splash" on v5p devices: the decoder (no bias, no dropout) runs splash,
    a Mosaic kernel in the compiled step. (That "xla" leaves none: the counting step's HLO in
    the first test above.)"""
    c = tiny_config("mae_lm", "self", 32, attention_impl="splash", relative_attention_buckets=8)
    c.model.decoder_relative_attention = False
    devices = topology.topology_devices(tpu_chips.parse("v5p-8"))
    compiled, oom, _, _ = compile_step.compile_step(
        configdict.freeze(c), devices, compile_step.FAST
    )
    assert oom is None
    hlo = compiled.as_text()
    assert "splash_mha_fwd" in hlo and "splash_mha_dkv" in hlo
