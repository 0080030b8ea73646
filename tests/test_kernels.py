"""`python -m maelm_jax.bench kernels` on the demo config at a tiny batch, as a user runs
it: the kernel summary of a traced train step adds up, is sorted, finds the step's matmuls
and survives its JSON; the categoriser on names the GPU and CPU backends really use. (Its
flags are bench's: tests/test_bad_input.py covers their bad values.)"""

import json
import types

import pytest
from test_bad_input import run_command

from maelm_jax.profiling import summary as ks
from maelm_jax.profiling import trace_files

STEPS, TOP = 3, 10


@pytest.mark.parametrize(
    ("name", "category"),
    [
        ("input_scatter_fusion_2", "scatter/gather"),
        ("pad_gather_fusion.1", "scatter/gather"),
        ("memcpy128", "copies"),
        ("copy.3", "copies"),
        ("copy_bitcast_fusion", "copies"),
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "matmul"),
        ("gemm_fusion_dot_3", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma", "attention"),
        ("cudnn_fmha_fwd", "attention"),
        ("loop_fusion", "elementwise"),
        ("loop_add_fusion_7", "elementwise"),
        ("input_reduce_fusion", "reductions"),
        ("input_add_reduce_fusion", "reductions"),
        ("input_transpose_fusion", "copies"),  # XLA GPU emits transposes as input fusions
        ("input_concatenate_fusion.2", "copies"),
        ("input_fusion", "reductions"),
        ("all-reduce.263", "collectives"),
        ("ncclDevKernel_AllGather_RING_LL", "collectives"),
        ("while.1342", "other"),
    ],
)
def test_categorise_known_names(name, category):
    assert ks.categorise(name) == category


def test_categorise_reads_the_fusions_opcodes():
    # XLA:CPU's dot fusions are called ynn_fusion; what decides is the dot inside.
    assert ks.categorise("fusion.3", {"fusion", "kCustom", "dot"}) == "matmul"
    assert ks.categorise("fusion.4", {"fusion", "kLoop", "gather", "add"}) == "scatter/gather"
    assert ks.categorise("fusion.5", {"fusion", "kLoop", "bitcast", "copy"}) == "copies"
    assert ks.categorise("fusion.6", {"fusion", "kLoop", "add", "multiply"}) == "elementwise"


def test_nested_ops_count_their_self_time():
    """A `while` holding two body ops: its own time is what the body does not cover."""
    ev = lambda name, start, dur: types.SimpleNamespace(
        name=name, start_ns=start, duration_ns=dur, stats=[("hlo_op", name)]
    )
    line = types.SimpleNamespace(events=[ev("while.1", 0, 100), ev("dot.2", 10, 30),
                                         ev("add.3", 50, 20), ev("copy.4", 100, 5)])  # fmt: skip
    got = {e.name: e.self_ns for e in trace_files._self_times(line, "cpu:0", require_hlo_op=True)}
    assert got == {"while.1": 50, "dot.2": 30, "add.3": 20, "copy.4": 5}


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """(the command's JSON for the demo config, its trace dir): 3 traced steps on one CPU
    device."""
    logdir = tmp_path_factory.mktemp("kernels")
    result = run_command(
        [
            "maelm_jax.bench", "kernels", "--configs=default", "--batch_size=2",
            "--seq_len=32", f"--steps={STEPS}", f"--top={TOP}", "--json", f"--logdir={logdir}",
        ],
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])["default"], logdir / "default"


def test_summary_adds_up_and_is_sorted(profiled):
    out, _ = profiled
    assert out["steps"] == STEPS and out["devices"] == 1
    assert sum(c["share"] for c in out["categories"]) == pytest.approx(1.0, abs=1e-9)
    assert [c["category"] for c in out["categories"]] == list(ks.CATEGORIES)
    total = sum(c["ms_per_step"] for c in out["categories"])
    assert total == pytest.approx(out["total_ms_per_step"], rel=1e-9)
    # The op times cover most of the wall step; XLA:CPU runs independent ops of one device
    # at once on this machine's 2 cores, so their sum may pass the wall time, not 3x it.
    assert 0.3 * out["wall_ms_per_step"] < out["total_ms_per_step"] < 3 * out["wall_ms_per_step"]
    times = [r["ms_per_step"] for r in out["rows"]]
    assert len(times) == TOP < out["num_kernels"] and times == sorted(times, reverse=True)
    assert "host:CPU" in out["source"]  # xprof's tables hold nothing for a CPU trace


def test_the_steps_matmuls_are_found(profiled):
    out, _ = profiled
    matmul = {c["category"]: c for c in out["categories"]}["matmul"]
    # Per step: the demo's 4 encoder layers alone each make >= 6 dots forward (q, k, v,
    # scores, values, out, 2 MLP) and twice that backward.
    assert matmul["share"] > 0.05 and matmul["count_per_step"] >= 4 * 6 * 3
    assert any(r["category"] == "matmul" for r in out["rows"])


def test_json_rebuilds_the_same_rows(profiled):
    out, logdir = profiled
    summary = ks.Summary.from_json(out)
    assert summary.to_json(TOP) == out
    text = ks.format_summary(summary, TOP)
    for r in out["rows"]:
        assert f"{r['category']:<15}{r['name']}" in text
    # The trace on disk gives the same table again (the summary is a pure function of it).
    again = trace_files.summarise_trace(trace_files.find_xplane(logdir), STEPS, devices=1)
    assert again.rows[:TOP] == summary.rows and again.num_kernels == out["num_kernels"]
