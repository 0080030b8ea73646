"""Ahead-of-time compilation for TPU slices, on this CPU, with libtpu's compile-only devices.

The compiles use a model wide enough (hidden 128) that matmuls dominate its FLOPs, so the
count can be held against a hand count: a scanned program counted as is, or per-device
FLOPs not multiplied by the device count, fall far outside the band.
"""

import importlib.util
import json

import pytest
from tiny_configs import run_command_on_tiny, tiny_config

from maelm_jax import compile as compile_command
from maelm_jax.aot import analyze, max_batch, topology
from maelm_jax.aot.report import format_report
from maelm_jax.config import configdict, run_config
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import tpu_chips
from maelm_jax.model import flop_count

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason='libtpu is not installed (pip install "jax[tpu]==0.10.2"); TPU compiles need it',
)
# Dropout's random bits are about a third of a tiny step's TPU compile (10.6 -> 7.4 s) and
# nothing here is about them; the splash test keeps them, as its subject.
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0)
MODEL = dict(hidden_size=128, mlp_dim=512, num_layers=2, **NO_DROPOUT)


def hand_count_flops(c) -> float:
    """Matmul FLOPs of one MAE-LM training step (forward + backward = 3x forward)."""
    m, batch, length = c.model, c.batch_size, c.seq_len
    k = run_config.num_masked(c.mask_rate, length)
    vocab = run_config.padded_vocab_size(c.vocab_size)
    # Q, K, V, O and the MLP per token, plus scores and weighted values over t tokens.
    per_token = lambda t: (
        2 * (4 * m.hidden_size**2 + 2 * m.hidden_size * m.mlp_dim) + (4 * t * m.hidden_size)
    )
    visible = length - k
    forward = m.num_layers * batch * visible * per_token(visible)
    forward += m.num_decoder_layers * batch * length * per_token(length)
    forward += batch * k * 2 * (m.hidden_size**2 + m.hidden_size * vocab)  # LM head
    return 3 * forward


def run_cli(tmp_path, *args, env=None):
    """`python -m maelm_jax.compile` on the tiny config with `args` appended."""
    return run_command_on_tiny("maelm_jax.compile", tmp_path, MODEL, *args, env=env)


@pytest.mark.parametrize(
    "name, libtpu_name, chips",
    [
        ("v4-8", "v4:2x2x1", 4),
        ("v4-32", "v4:2x2x4", 16),
        ("v4-128", "v4:4x4x4", 64),
        ("v5p-8", "v5:2x2x1", 4),
        ("v5p-64", "v5:2x4x4", 32),
        ("v5p-128", "v5:4x4x4", 64),
        ("v5p-2048", "v5:8x8x16", 1024),
        ("v5e-1", "v5e:1x1", 1),
        ("v5litepod-16", "v5e:4x4", 16),
        ("v6e-8", "v6e:2x4", 8),
        ("v6e-64", "v6e:8x8", 64),
        ("v6e-256", "v6e:16x16", 256),
        ("v5p:4x4x12", "v5:4x4x12", 192),
    ],
)
def test_slice_names_map_to_cloud_tpu_shapes(name, libtpu_name, chips):
    s = tpu_chips.parse(name)
    assert (s.libtpu_name, s.num_chips) == (libtpu_name, chips)


@needs_libtpu
@pytest.mark.parametrize("name", ["v4-8", "v5p-8", "v5e-1", "v5litepod-16", "v6e-8"])
def test_every_chip_kind_gets_compile_only_devices(name):
    """v5e and v6e have no chip_config_name; libtpu once got None for it and raised TypeError."""
    s = tpu_chips.parse(name)
    devices = topology.topology_devices(s)
    assert len(devices) == s.num_chips
    assert {d.platform for d in devices} == {"tpu"}


@pytest.mark.parametrize("name", ["v5p-64x", "v7-8", "v5p-12", "v5p-63", "v4-4", "v6e:8x8x1", ""])
def test_unknown_slice_names_are_config_errors(name):
    """(The command's one-line error and exit status for such a name: test_bad_input.py.)"""
    with pytest.raises(ConfigError, match=r"topology=.* is not allowed.*v5p-64"):
        tpu_chips.parse(name)


def test_missing_libtpu_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    with pytest.raises(topology.LibtpuMissingError, match=r'pip install "jax\[tpu\]'):
        analyze.analyze(configdict.freeze(tiny_config()), "v5p-8")


@needs_libtpu
def test_cli_json_reports_memory_and_unrolled_flops(tmp_path):
    cache = tmp_path / "xla_cache"  # a user's persistent compilation cache
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache)}
    result = run_cli(tmp_path, "--topology=v5p-8", "--json", "--flops=unrolled", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    # Compile-only programs cannot be read back from it (jax warns): none were written.
    assert not (cache.exists() and any(cache.iterdir()))
    report = json.loads(result.stdout)
    assert (report["topology"], report["num_devices"], report["fits"]) == ("v5p-8", 4, True)
    assert report["mesh_shape"] == {"data": 1, "fsdp": 4, "tensor": 1}
    memory = report["memory"]
    assert min(memory["arguments"], memory["outputs"], memory["temporaries"]) > 0
    assert memory["aliased"] <= memory["outputs"]  # the donated state, written in place
    assert report["memory_per_chip_bytes"] == memory["total"] >= memory["arguments"]
    assert report["hbm_per_chip_bytes"] == tpu_chips.CHIPS["v5p"].usable_hbm_bytes
    assert report["flops_per_step"] == pytest.approx(4 * report["flops_per_device"])
    assert "UNDERCOUNT" not in report["flops_source"]
    # Matmuls plus a little: layer norms, softmax, dropout bits, the optimizer.
    ratio = report["flops_per_step"] / hand_count_flops(tiny_config(**MODEL))
    assert 1.0 <= ratio <= 1.5, ratio
    # The analytic count the default one-compile preflight uses, against XLA's on TPU.
    ratio = report["flops_per_step"] / report["model_flops_per_step"]
    assert 1.0 <= ratio <= 1 + flop_count.TOLERANCE, ratio
    assert report["compile_seconds"] > 0 and report["step_seconds_lower_bound"] > 0
    # XLA's step-time estimate: no faster than the FLOPs at peak, and an MFU below 1.
    assert report["estimated_step_seconds"] >= report["step_seconds_lower_bound"]
    assert 0 < report["estimated_mfu"] < 1


@needs_libtpu
def test_cli_step_that_does_not_fit_exits_nonzero(tmp_path):
    big = f"--config.batch_size={2**22}"  # no step-time estimate: its programs cannot fit
    result = run_cli(tmp_path, "--topology=v5p-8", "--json", big, "--step_time=skip")
    assert result.returncode == compile_command.EXIT_DOES_NOT_FIT, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["fits"] is False and "RESOURCE_EXHAUSTED" in report["oom_message"]
    assert report["memory_per_chip_bytes"] > report["hbm_per_chip_bytes"]
    assert "does not fit" in result.stderr


@needs_libtpu
def test_two_slices_build_a_hybrid_mesh():
    report = analyze.analyze(
        configdict.freeze(tiny_config(**NO_DROPOUT)),
        "v5p-8",
        num_slices=2,
        flops="skip",
        step_time="skip",
    )
    assert (report.num_devices, report.num_slices, report.fits) == (8, 2, True)
    assert report.mesh_shape == {"data": 2, "fsdp": 4, "tensor": 1}  # data over DCN
    assert report.memory.total >= report.memory.arguments > 0
    assert report.flops_per_step is None and "skip" in report.flops_source


@pytest.fixture(scope="module")
def fast_and_near():
    """The smallest tiny step on v5p-8 analysed twice: at the default (fast) effort, then with
    HBM such that the fast total is 90% of it, where the verdict must come from a full
    compile (the probes' kind, which the max_batch test starts from)."""
    config = configdict.freeze(tiny_config(**NO_DROPOUT))
    fast = analyze.analyze(config, "v5p-8", flops="skip", step_time="skip")
    near = analyze.analyze(
        config, "v5p-8", flops="skip", step_time="skip", hbm_bytes=int(fast.memory.total / 0.9)
    )
    return fast, near


@needs_libtpu
def test_a_fast_compile_near_the_limit_is_redone_at_full_effort(fast_and_near):
    fast, near = fast_and_near
    assert (fast.effort, fast.fast_memory_per_chip_bytes) == ("fast", None)
    assert fast.memory.total < analyze.CONFIRM_SHARE * fast.hbm_per_chip_bytes
    assert (near.effort, near.fast_memory_per_chip_bytes) == ("full", fast.memory.total)
    assert near.memory_per_chip_bytes == near.memory.total and near.compile_seconds > 0
    assert "fast, then full" in format_report(near)
    with pytest.raises(ConfigError, match="effort='quick' is not allowed"):
        analyze.analyze(configdict.freeze(tiny_config()), "v5p-8", effort="quick")


@needs_libtpu
def test_max_batch_fits_and_the_next_unit_does_not(fast_and_near):
    _, first = fast_and_near  # the same step, compiled at full effort (the probes' kind)
    assert (first.effort, first.batch_size) == ("full", 8)
    config = tiny_config(**NO_DROPOUT)  # no width needed; the smallest step compiles fastest
    run = configdict.freeze(config)
    devices = topology.topology_devices(tpu_chips.parse("v5p-8"))
    hbm = int(first.memory.total * 1.05)  # a bound that bites within a few batch units
    found = max_batch.max_batch(
        run, devices, hbm, (config.batch_size, True, first.memory.total, True)
    )
    assert found.unit == 4 and found.batch_size % found.unit == 0  # fsdp=4 shards the batch
    assert (found.batch_size, True) in {(b, ok) for b, ok, _ in found.probes}
    # Exact: the next multiple of the unit was probed and does not fit (a compile of any
    # larger batch, e.g. the double, would only say it again).
    assert (found.batch_size + found.unit, False) in {(b, ok) for b, ok, _ in found.probes}
    # The line through two probes predicts the edge: a few compiles, not a bisection's ten.
    assert len(found.probes) <= 4, found.probes
