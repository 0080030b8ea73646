"""A run with a profile window: its XProf trace shows the step markers and the regions, and
its metrics carry the throughput telemetry. One tiny in-process run serves both."""

import collections
import re

import pytest
from etils import epath
from tensorflow.compiler.xla.service import hlo_pb2
from tensorflow.tsl.profiler.protobuf import xplane_pb2
from text_corpora import sample_document, write_corpus
from tiny_configs import tiny_run_config

from maelm_jax.config import configdict
from maelm_jax.data.tokenizer import Tokenizer
from maelm_jax.model import flop_count
from maelm_jax.training import metric_logging, profile_window, telemetry, train

REGIONS = ("encoder", "decoder", "lm_head", "loss", "optimizer")
START, NUM = 3, 2


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    documents = [sample_document(i) for i in range(80)]
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), documents)
    workdir = tmp_path_factory.mktemp("run")
    config = tiny_run_config(
        corpus,
        num_train_steps=8,
        eval_batches=0,
        checkpoint_every_steps=4,
        profile_start_step=START,
        profile_num_steps=NUM,
        peak_flops_per_device=1e12,
    )
    train.train_and_evaluate(configdict.freeze(config), workdir)
    return config, workdir


def _trace(workdir):
    """(step numbers marked in the trace, {region: executed ops whose op_name is in it})."""
    (path,) = epath.Path(workdir).glob("plugins/profile/*/*.xplane.pb")
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    planes = {p.name: p for p in space.planes}
    meta = planes["/host:metadata"]
    op_names = {}
    for event in meta.event_metadata.values():
        for stat in event.stats:
            if meta.stat_metadata[stat.metadata_id].name == "Hlo Proto":
                hlo = hlo_pb2.HloProto.FromString(stat.bytes_value)
                for computation in hlo.hlo_module.computations:
                    for op in computation.instructions:
                        op_names[op.name] = op.metadata.op_name
    host = planes["/host:CPU"]
    stat_name = lambda s: host.stat_metadata[s.metadata_id].name
    steps, regions = set(), collections.defaultdict(set)
    for line in host.lines:
        for event in line.events:
            for stat in event.stats:
                if (
                    host.event_metadata[event.metadata_id].name == "train"
                    and stat_name(stat) == "step_num"
                ):
                    steps.add(stat.int64_value or stat.uint64_value)  # fmt: skip
                if stat_name(stat) == "hlo_op":
                    op = host.stat_metadata[stat.ref_value].name
                    # "jit(train_step)/transpose(jvp(MaskedLM))/encoder/layers_0/..."
                    for part in set(re.split(r"[/()]", op_names.get(op, ""))) & set(REGIONS):
                        regions[part].add(op)
    return steps, regions


def test_profile_window_traces_its_steps_and_the_regions(profiled_run):
    _, workdir = profiled_run
    steps, regions = _trace(workdir)
    # The window and the next step's dispatch (the trace stops once the last one finished);
    # never the compile step 0.
    assert set(range(START, START + NUM)) <= steps <= set(range(START, START + NUM + 1))
    assert {r for r in REGIONS if regions[r]} == set(REGIONS), {r: len(regions[r]) for r in REGIONS}


def test_metrics_carry_model_flops_and_mfu(profiled_run):
    config, workdir = profiled_run
    metrics = metric_logging.read_metrics(workdir)
    rows = [metrics[s] for s in sorted(metrics)]
    # The first steps (the compile) are excluded: no rates until two steps have finished.
    assert "model_tflops_per_sec" not in rows[0]
    last = rows[-1]
    c = config.copy_and_resolve_references()
    c.vocab_size = Tokenizer.from_path(epath.Path(workdir) / "tokenizer.model").vocab_size
    c = configdict.freeze(c)
    tflops_per_token = last["model_tflops_per_sec"] / last["tokens_per_sec"]
    flops_per_token = flop_count.step_flops(c, flop_count.num_params(c)) / (
        c.batch_size * c.seq_len
    )
    assert tflops_per_token * 1e12 == pytest.approx(flops_per_token, rel=0.05)
    assert last["mfu"] == pytest.approx(last["model_tflops_per_sec"] / 8, rel=1e-6)  # 8 x 1 TF/s
    assert last["eta_seconds"] == 0.0
    tokens_per_step = c.batch_size * c.seq_len
    assert last["tokens_per_sec"] == pytest.approx(last["steps_per_sec"] * tokens_per_step)
    # The save after step 4's line falls in step 5's window, and in no other.
    shares = {step: row.get("time_share/checkpoint") for step, row in metrics.items()}
    assert 0 < shares.pop(5) <= 1 and set(shares.values()) == {None}, shares


def test_progress_line_gives_the_rate_and_eta_once_the_clock_runs():
    assert telemetry.progress_line(3, 24, {}) == "step 3/24 (12%)"
    row = {"steps_per_sec": 2.5, "eta_seconds": 3725.4}
    assert telemetry.progress_line(12, 24, row) == "step 12/24 (50%): 2.5 steps/s, ETA 1:02:05"


def test_no_window_no_trace_even_at_the_default_start_step(monkeypatch, tmp_path):
    """profile_num_steps=0 (the default) writes no trace, also at profile_start_step."""
    started = []
    monkeypatch.setattr("jax.profiler.start_trace", started.append)
    window = profile_window.ProfileWindow(tmp_path, start=10, num_steps=0, first_step=0)
    for done in range(1, 20):
        window(done)
    window.close()
    assert started == []
