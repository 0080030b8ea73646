"""`bench speed`: its FLOP rates come from the count training logs, no step recompiles, and a
config's own (pod-sized) batch that does not fit is one line naming it. `bench finetune`:
each change to the fine-tuning loop timed and counted."""

import json

import jax
import numpy as np
import pytest
from test_bad_input import assert_one_line_error, run_command
from tiny_configs import printed_by_fresh_python

from configs import default
from maelm_jax.config import cli, configdict
from maelm_jax.model import flop_count
from maelm_jax.training import step_speed

ARGS = dict(seq_len=32, batch_size=2)
# A config file of the user's own, by path: the demo model at a quarter of its width.
SMALL = """from configs import default


def get_config():
    c = default.get_config()
    c.model.num_layers, c.model.hidden_size, c.model.mlp_dim = 2, 64, 128
    return c
"""


def expected_flops(config) -> float:
    config.seq_len, config.batch_size = ARGS["seq_len"], ARGS["batch_size"]
    run = configdict.freeze(config)
    return flop_count.step_flops(run, flop_count.num_params(run))


def test_speed_reports_model_flops_against_the_matmul_and_no_recompile(tmp_path):
    small = tmp_path / "small.py"
    small.write_text(SMALL)
    names = [str(small), "default"]
    flags = [f"--{k}={v}" for k, v in ARGS.items()]
    result = run_command(
        [
            "maelm_jax.bench",
            "speed",
            f"--configs={','.join(names)}",
            *flags,
            "--rounds=2",
            "--steps=2",
            "--json",
        ],
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["recompiles"] == 0
    assert report["matmul"]["dtype"] == "float32"  # CPU: emulated bf16 would say nothing
    rows = {row["config"]: row for row in report["configs"]}
    assert list(rows) == names and all(row["dtype"] == "float32" for row in rows.values())
    configs = {str(small): cli.load_config_file(str(small)), "default": default.get_config()}
    flops = {name: expected_flops(config) for name, config in configs.items()}
    for name, row in rows.items():
        assert row["flops_per_step"] == flops[name]
        assert row["flops_vs_first"] == flops[name] / flops[str(small)]
        tokens = ARGS["seq_len"] * ARGS["batch_size"]
        assert (
            abs(row["tokens_per_sec"] - tokens * row["steps_per_sec"])
            < 1e-6 * row["tokens_per_sec"]
        )
        assert row["of_matmul"] > 0 and row["model_tflops_per_sec"] > 0
        assert row["mfu"] is None  # a CPU has no published peak
    assert report["device_peak_gib"] is None  # nor a memory count
    small_model = configs[str(small)].model  # the reference matmul is the first config's MLP
    assert report["matmul"]["shape"] == [
        ARGS["seq_len"] * ARGS["batch_size"],
        small_model.hidden_size,
        small_model.mlp_dim,
    ]
    assert rows[str(small)]["step_time_vs_first"] == 1.0
    assert rows["default"]["step_time_vs_first"] > 1.0  # twice the layers, 4x the width


def test_speed_at_a_batch_that_does_not_fit_names_it_and_the_flags():
    # mlm_base's own batch, 8192 x 512, is a pod's: XLA asks for terabytes on this CPU.
    result = run_command(["maelm_jax.bench", "speed", "--configs=mlm_base"], timeout=600)
    assert_one_line_error(
        result,
        1,
        "mlm_base at batch 8192 x seq_len 512 does not fit in the memory of",
        "RESOURCE_EXHAUSTED",
        "--batch_size=8 --seq_len=128",
        prog="maelm_jax.bench",
    )


def test_a_program_read_from_the_persistent_cache_counts_as_a_compile():
    """The recompile count must see a new program that the persistent compilation cache
    (this session has one, as pods often do) serves without a backend compile."""
    assert jax.config.jax_compilation_cache_dir  # conftest.py's
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None
    )
    step_speed._CompileCounter.install()
    program = jax.jit(lambda x: x * 3.0 + 1.25)  # compiled by no other test
    counts = [step_speed._CompileCounter.count]
    for _ in range(2):
        program(np.arange(7.0, dtype=np.float32)).block_until_ready()
        counts.append(step_speed._CompileCounter.count)
        jax.clear_caches()  # the next call finds it only on disk
    assert len(hits) == 1  # the second call was served from the cache...
    assert np.diff(counts).tolist() == [1, 1]  # ...and still counts as a compile


@pytest.mark.parametrize(
    "device_kind, bf16_peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA L4", 121e12),
        ("TPU v4", 275e12),
        ("TPU v5 lite", 197e12),
        ("TPU v5p", 459e12),
        ("TPU v6 lite", 918e12),
    ],
)
def test_mfu_divides_by_the_devices_published_bf16_peak(device_kind, bf16_peak):
    assert step_speed.mfu(0.5 * bf16_peak * 4, device_kind, "bfloat16", 4) == pytest.approx(0.5)
    assert step_speed.mfu(1e12, "cpu", "bfloat16", 1) is None


def test_bench_starts_without_tensorflow():
    """TensorFlow (~5 s to import) serves TFDS and gs:// alone: `bench` and its step timing
    load without it."""
    code = "import sys, maelm_jax.bench; print('tensorflow' in sys.modules)"
    assert printed_by_fresh_python(code) == ["False"]


def test_bench_finetune_times_each_change_and_counts_its_calls():
    """`bench finetune` on a CPU: every eager variant, rates from interleaved rounds, and the
    count the fused update cuts (AdamW's ~10 calls a tensor become a few for all)."""
    result = run_command(
        ["maelm_jax.bench", "finetune", "--finetune_encoder=1x64", "--batch_size=4",
         "--seq_len=16", "--finetune_steps=2", "--finetune_rounds=2", "--json"],
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    rows = found["variants"]
    assert list(rows) == [
        "today", "no host syncs", "+ fused AdamW", "+ last layer at <s> only",
        "+ host dropout masks",
    ]  # fmt: skip
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert 0 < row["steps_per_s_low"] <= row["steps_per_s"] <= row["steps_per_s_high"]
    fused, plain = rows["+ fused AdamW"], rows["no host syncs"]
    assert fused["aten_calls_per_step"] < 0.6 * plain["aten_calls_per_step"]
    assert found["shape"]["rows"] == "synthetic" and found["shape"]["device"] == "cpu"


def test_bench_finetune_squad_times_our_loop_and_trainer_on_the_same_work():
    """`bench finetune --finetune_task=squad_v2`: our loop and transformers' Trainer, both
    timed, on the same tokens a step; at dropout 0 the same model on the same batches gives
    the same first losses, which another init, batch order or label layout would not."""
    result = run_command(
        ["maelm_jax.bench", "finetune", "--finetune_task=squad_v2", "--finetune_encoder=1x64",
         "--batch_size=2", "--seq_len=96", "--finetune_steps=2", "--finetune_rounds=2",
         "--finetune_dropout=0", "--json"],
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    rows = found["loops"]
    assert list(rows) == ["ours (finetuning/training.py)", "transformers Trainer"]
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        assert 0 < row["tokens_per_s_low"] <= row["tokens_per_s"] <= row["tokens_per_s_high"]
        assert row["tokens_per_step"] == 2 * 96
        assert len(row["first_losses"]) == 3
    ours, trainer = rows.values()
    assert ours["first_losses"] == pytest.approx(trainer["first_losses"], rel=1e-4)
    assert found["shape"]["seq_len"] == 96 and found["shape"]["rows"] == "squad_v2"


def test_bench_finetune_on_a_task_needs_the_export_that_tokenizes_it(tmp_path):
    result = run_command(["maelm_jax.bench", "finetune", "--finetune_task=sst2"])
    needs = "--finetune_task needs --finetune_export"
    assert_one_line_error(result, 2, needs, prog="maelm_jax.bench")
    result = run_command(["maelm_jax.bench", "finetune", f"--finetune_export={tmp_path}"])
    assert_one_line_error(
        result, 1, f"--finetune_export={tmp_path}: not a HuggingFace export", prog="maelm_jax.bench"
    )
