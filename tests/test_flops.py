"""The FLOP report on a small model: XLA's cost analysis of the real step and of each
region's own program, against the analytic formula (`flop_count`)."""

import dataclasses
import importlib.util
import json

import jax
import pytest
from tiny_configs import run_command_on_tiny, tiny_config

from maelm_jax.aot import flops_by_method
from maelm_jax.config import configdict
from maelm_jax.model import flop_count

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="TPU compiles need libtpu"
)

# Wide enough that matmuls dominate and deep enough (6 encoder layers to the paper decoders'
# 2) that skipping masked tokens in the encoder pays, as at real sizes. No dropout: its
# random bits are a large part of a tiny program's compile, and no count here is about them.
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0)
MODEL = dict(hidden_size=64, mlp_dim=256, num_layers=6, seq_len=32, **NO_DROPOUT)


@pytest.fixture(scope="module")
def rows():
    config = tiny_config(**MODEL)
    methods = ("mlm", "3ml_self", "3ml_cross")
    run = configdict.freeze(config)
    return {r.method: r for r in flops_by_method.table(run, jax.devices()[:1], 0.5, methods)}


def test_masked_encoders_save_flops_in_the_expected_order(rows):
    # At 50%: 3ML-self's encoder sees half the tokens but its decoder all of them;
    # 3ML-cross's decoder runs on the masked half only.
    assert rows["3ml_cross"].xla_total < rows["3ml_self"].xla_total < rows["mlm"].xla_total
    assert rows["3ml_self"].ratio_to_mlm == pytest.approx(
        rows["3ml_self"].xla_total / rows["mlm"].xla_total
    )
    # Same ordering analytically, and the regions move as the methods say they should.
    a = {m: r.analytic_regions for m, r in rows.items()}
    assert a["3ml_cross"]["encoder"] == a["3ml_self"]["encoder"] < a["mlm"]["encoder"]
    assert a["mlm"]["decoder"] == 0 < a["3ml_cross"]["decoder"] < a["3ml_self"]["decoder"]


def test_regions_add_up_to_the_step(rows):
    for r in rows.values():
        assert sum(r.analytic_regions.values()) == pytest.approx(r.analytic_total)
        assert sum(r.xla_regions.values()) == pytest.approx(r.xla_total)
        # The per-region programs cover the step: what lies between them (masking, the
        # gathers between regions, the gradient norm) is a small remainder.
        assert abs(r.xla_regions["other"]) < 0.05 * r.xla_total, r.xla_regions
        for region in ("encoder", "lm_head", "optimizer"):
            assert r.xla_regions[region] > 0


def test_analytic_total_matches_xla_within_the_tolerance(rows):
    for r in rows.values():
        assert 1.0 <= r.xla_over_analytic <= 1 + flop_count.TOLERANCE, (r.method, r)
        # Per region too: the formula's matmuls are most of what XLA counts.
        for region in ("encoder", "decoder", "lm_head"):
            xla, analytic = r.xla_regions[region], r.analytic_regions[region]
            if analytic:
                assert 1.0 <= xla / analytic <= 1 + flop_count.TOLERANCE, (r.method, region)


def test_table_prints_every_method_and_the_verdict(rows):
    text = flops_by_method.format_table(list(rows.values()), "header")
    assert [line.split()[0] for line in text.splitlines()[3:6]] == list(rows)
    assert text.splitlines()[-1].endswith("yes")


def test_blocked_attention_and_lm_head_count_the_same(rows):
    """Query blocks and LM-head slot blocks are loops, which XLA's cost analysis counts
    once; the report counts the same step with them unrolled, as without blocks."""
    config = tiny_config(**MODEL)
    config.model.attention_query_chunk = 8
    config.model.lm_head_chunk = 4  # 16 masked slots at 50%: 4 blocks
    (blocked,) = flops_by_method.table(
        configdict.freeze(config), jax.devices()[:1], 0.5, ("3ml_self",)
    )
    assert blocked.xla_total == pytest.approx(rows["3ml_self"].xla_total, rel=1e-6)


def test_cpu_rows_carry_no_time_estimate(rows):
    """The CPU compiler has no cost model of time: no number rather than a made-up one."""
    assert all(r.seconds is None and r.time_ratio_to_mlm is None for r in rows.values())
    assert "optimal_seconds" not in flops_by_method.format_table(list(rows.values()), "h")


@needs_libtpu
def test_cli_json_has_the_methods_estimated_time_split_by_region(tmp_path):
    """`python -m maelm_jax.flops --topology=... --methods=mae_lm --json`, as a user runs it,
    at XLA's fastest effort and on the smallest tiny model, one encoder layer: the checks are
    of the report's shape, which holds at any effort and size, not of the estimates' values.
    Two methods (mlm comes unasked, as the base of the ratios) are half the TPU compiles of
    four; the `rows` fixture above counts all of them on the CPU. (At batch 4, one row per
    chip, some regions of 3ML get no time estimate.)"""
    result = run_command_on_tiny(
        "maelm_jax.flops",
        tmp_path,
        {"num_layers": 1, **NO_DROPOUT},
        "--topology=v5p-8",
        "--batch_size=16",
        "--methods=mae_lm",
        "--json",
        env={"JAX_OPTIMIZATION_LEVEL": "O0"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["devices"] == "v5p-8 (4 chips, compile-only)"
    assert "batch 16 x seq 32" in report["model"]
    methods = report["methods"]
    assert list(methods) == ["mlm", "mae_lm"]
    base = methods["mlm"]
    for name, m in methods.items():
        assert m["seconds"] > 0, name
        assert set(m["region_seconds"]) == set(flops_by_method.COLUMNS)
        assert sum(m["region_seconds"].values()) == pytest.approx(m["seconds"])
        assert all(m["region_seconds"][r] > 0 for r in ("encoder", "optimizer")), name
        assert m["time_ratio_to_mlm"] == pytest.approx(m["seconds"] / base["seconds"])
        assert m["ratio_to_mlm"] == pytest.approx(m["xla_total"] / base["xla_total"])
    assert base["region_seconds"]["decoder"] == 0 < methods["mae_lm"]["region_seconds"]["decoder"]
    # The JSON carries whole rows: the table a person reads comes back from it.
    fields = [f.name for f in dataclasses.fields(flops_by_method.Row)]
    rows = [flops_by_method.Row(**{f: m[f] for f in fields}) for m in methods.values()]
    text = flops_by_method.format_table(rows, "header").splitlines()
    timed = text.index(next(line for line in text if "optimal_seconds" in line))
    assert [line.split()[0] for line in text[timed + 2 : timed + 4]] == list(methods)


def test_cli_names_an_unknown_method_and_the_allowed_ones(tmp_path):
    methods = "mae_lm,bert"
    result = run_command_on_tiny(
        "maelm_jax.flops", tmp_path, {"num_layers": 1}, f"--methods={methods}", timeout=120
    )
    assert result.returncode == 2, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if "maelm_jax.flops: error" in x]
    assert f"--methods={methods}" in line
    assert "unknown bert; allowed: mlm, mae_lm, 3ml_self, 3ml_cross" in line
    assert result.stdout == ""


def test_the_modern_backbone_counts_its_geglu_within_the_tolerance():
    """The GeGLU's third matrix and the blocked local layers' key spans are in the formula:
    XLA's count of the modern step stays within the tolerance of it, per method and region."""
    # Local layers blocked: 4 queries against 12 of 16 kept keys. Three layers (one global,
    # two local) hold every kind the formula counts; six took twice the compile.
    modern = dict(backbone="modern", local_attention=8, local_attention_block=4)
    run = configdict.freeze(tiny_config(**{**MODEL, "num_layers": 3}, **modern))
    for r in flops_by_method.table(run, jax.devices()[:1], 0.5, ("3ml_cross",)):
        assert 1.0 <= r.xla_over_analytic <= 1 + flop_count.TOLERANCE, (r.method, r)
        for region in ("encoder", "decoder"):
            xla, analytic = r.xla_regions[region], r.analytic_regions[region]
            if analytic:
                assert 1.0 <= xla / analytic <= 1 + flop_count.TOLERANCE, (r.method, region)
