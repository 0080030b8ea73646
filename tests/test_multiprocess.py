"""Several processes, as on a pod: two `python -m maelm_jax.main` processes joined by
jax.distributed (gloo collectives on localhost, 4 simulated CPU devices each) train one run
together; their checkpoint is restored and resumed by a single process; a bad config stops
both processes with a one-line error instead of a hang.
"""

import dataclasses
import functools
import json
import pathlib
import re
import shutil

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from process_runs import DEVICES_PER_PROCESS, ProcessResult, describe, run_main
from text_corpora import sample_document, write_corpus
from tiny_configs import run_flags, tiny_run_config

from maelm_jax.checkpoints import checkpointing, manifest
from maelm_jax.config import configdict
from maelm_jax.config.run_config import RunConfig
from maelm_jax.data import preparation, shards
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.batches import TrainBatches
from maelm_jax.data.documents import _held_out, read_documents
from maelm_jax.data.shard_writer import pack_documents
from maelm_jax.step import programs, sharding
from maelm_jax.training import metric_logging, train

STEPS = 8
PROCESSES = 2
TIMEOUT = 300  # seconds for a whole multi-process run: a deadlock fails, never hangs
_LOGGED = re.compile(r"metric_logging\.py:\d+\] \[(\d+)\] (.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Run:
    config: ml_collections.ConfigDict
    workdir: pathlib.Path
    results: list[ProcessResult]

    @property
    def frozen(self) -> RunConfig:
        return configdict.freeze(self.config)


def _config(dataset: str, **overrides):
    settings = dict(
        num_train_steps=STEPS, checkpoint_every_steps=4, eval_every_steps=STEPS, eval_batches=1
    )
    return tiny_run_config(dataset, **(settings | overrides))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = [sample_document(i) for i in range(160)]
    return write_corpus(tmp_path_factory.mktemp("corpus"), docs)


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory):
    """The shared 2-process run: STEPS steps, checkpoints at 4 and STEPS, eval at STEPS."""
    config = _config(corpus)
    workdir = tmp_path_factory.mktemp("two_processes")
    results = run_main(
        [f"--workdir={workdir}", *run_flags(config)],
        num_processes=PROCESSES,
        log_dir=tmp_path_factory.mktemp("two_process_logs"),
        timeout=TIMEOUT,
    )
    assert [r.returncode for r in results] == [0] * PROCESSES, describe(results)
    return Run(config, workdir, results)


@pytest.fixture(scope="module")
def tokenizer(run):
    return tokenizer_lib.Tokenizer.from_path(run.workdir / tokenizer_lib.MODEL_FILENAME)


@pytest.fixture(scope="module")
def mapped(run, tokenizer):
    """{process: its train blocks}: its shards of the corpus the run prepared once (a shard
    count both processes divide), as the run mapped them."""
    data = run.frozen.data
    directory, manifest = shards.find(data, tokenizer.fingerprint, PROCESSES)
    assert manifest["num_shards"] == preparation.shard_count(PROCESSES)
    return {
        p: np.asarray(shards.open_share(directory, manifest, "train", p, PROCESSES, data)[0])
        for p in range(PROCESSES)
    }


@pytest.fixture(scope="module")
def progs(run, tokenizer):
    """The run's programs in this pytest process: 1 process, 8 devices."""
    frozen = run.frozen
    return programs.build(frozen, sharding.create_mesh(frozen.mesh), tokenizer.vocab_size)


def _logged_rows(log: str) -> dict[int, dict[str, str]]:
    """LoggingWriter lines `[step] key=value, ...` -> {step: {key: value as printed}}."""
    rows: dict[int, dict[str, str]] = {}
    for step, body in _LOGGED.findall(log):
        for item in body.split(", "):
            key, _, value = item.partition("=")
            rows.setdefault(int(step), {})[key] = value
    return rows


def _saved_state(workdir, step: int) -> dict:
    """The checkpoint's whole state as host numpy arrays, read without any target sharding."""
    path = workdir / manifest.CHECKPOINT_DIRNAME / str(step) / "state"
    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(path).item_metadata.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def _row_set(blocks: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in np.asarray(blocks, np.int32)}


# --- A: one run over two processes ----------------------------------------------------------


def test_processes_join_one_mesh_of_all_devices(run):
    for p, result in enumerate(run.results):
        (line,) = re.findall(rf"Process {p} of {PROCESSES}; local devices: (.*)", result.stderr)
        assert line.count("CpuDevice(") == DEVICES_PER_PROCESS, line
        assert f"Mesh {{'data': 1, 'fsdp': 8, 'tensor': 1}} over {PROCESSES} processes" in (
            result.stderr
        )
    # Only process 0 writes files: one TensorBoard log, one metrics.jsonl.
    assert len(list(run.workdir.glob("events.out.tfevents.*"))) == 1


def test_both_processes_log_the_same_losses(run):
    metrics = metric_logging.read_metrics(run.workdir)  # written by process 0
    logged = _logged_rows(run.results[1].stderr)  # process 1's own console
    train_steps = [s for s in sorted(metrics) if "train/loss" in metrics[s]]
    assert train_steps == list(range(1, STEPS + 1))
    assert [s for s in sorted(logged) if "train/loss" in logged[s]] == train_steps
    for step in train_steps:
        for key in ("train/loss", "train/accuracy", "grad_norm"):
            assert logged[step][key] == f"{metrics[step][key]:.6g}", (step, key)
    assert logged[STEPS]["eval/loss"] == f"{metrics[STEPS]['eval/loss']:.6g}"
    losses = [metrics[s]["train/loss"] for s in train_steps]
    assert losses[-1] < losses[0], losses  # it trains


def test_each_process_maps_only_its_shards_of_the_documents(run, mapped, tokenizer):
    num_shards = preparation.shard_count(PROCESSES)
    by_shard = [
        list(read_documents(run.frozen.data, "train", i, num_shards)) for i in range(num_shards)
    ]
    everything = list(read_documents(run.frozen.data, "train", 0, 1))
    shares = [[d for docs in by_shard[p::PROCESSES] for d in docs] for p in range(PROCESSES)]
    assert all(shares)
    assert set(shares[0]).isdisjoint(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(everything)
    for p in range(PROCESSES):  # shard i: the documents a process i of num_shards reads
        expected = [
            pack_documents(tokenizer.encode_batch(docs), run.config.seq_len)
            for docs in by_shard[p::PROCESSES]
            if docs
        ]
        np.testing.assert_array_equal(mapped[p], np.concatenate(expected), err_msg=f"process {p}")


def test_each_process_reads_half_of_every_batch_from_its_own_shards(run, mapped):
    local = run.config.batch_size // PROCESSES
    own = {p: _row_set(blocks) for p, blocks in mapped.items()}
    for p in range(PROCESSES):
        batches = TrainBatches(mapped[p], local, run.config.seed, p)
        for step in range(STEPS):
            rows = batches.batch(step)
            assert rows.shape == (local, run.config.seq_len)
            assert _row_set(rows) <= own[p], (p, step)
    # The checkpoint records every process's position: half the batch per step, its blocks.
    data_dir = run.workdir / manifest.CHECKPOINT_DIRNAME / str(STEPS) / "data"
    saved = json.loads((data_dir / "metadata").read_text())
    assert saved == {
        "process_count": PROCESSES,
        "processes": [
            TrainBatches(mapped[p], local, run.config.seed, p).state(STEPS)
            for p in range(PROCESSES)
        ],
    }


def test_the_first_step_trained_on_both_halves(run, mapped, progs):
    """Step 0 recomputed in this (1-process, 8-device) pytest process on process 0's rows
    followed by process 1's reproduces the loss the two processes logged."""
    local = run.config.batch_size // PROCESSES

    def loss_on(rows: np.ndarray) -> float:
        state = progs.initialize(jax.random.PRNGKey(run.config.seed))
        batch = {"input_ids": jax.device_put(rows, progs.batch_sharding)}
        with sharding.activate(progs.mesh, progs.rules):
            _, metrics = progs.train_step(state, batch)
        return float(metrics["loss"])

    halves = [TrainBatches(mapped[p], local, run.config.seed, p).batch(0) for p in range(2)]
    logged = metric_logging.read_metrics(run.workdir)[1]["train/loss"]
    assert loss_on(np.concatenate(halves)) == pytest.approx(logged, rel=1e-5)
    # The check can tell: process 0's rows twice would have given another loss.
    assert loss_on(np.concatenate([halves[0], halves[0]])) != pytest.approx(logged, rel=1e-5)


# --- B: saved by two processes, restored and resumed by one ---------------------------------


def test_one_process_restores_the_two_process_checkpoint(run, tokenizer, progs):
    abstract = progs.abstract_state()
    checkpointer = checkpointing.Checkpointer(run.frozen, run.workdir, tokenizer)
    try:
        with sharding.activate(progs.mesh, progs.rules):
            state, data = checkpointer.restore_latest(abstract)
    finally:
        checkpointer.close()
    assert int(jax.device_get(state.step)) == STEPS
    assert [p["step"] for p in data["processes"]] == [STEPS] * PROCESSES
    on_disk = _saved_state(run.workdir, STEPS)
    restored = jax.tree_util.tree_leaves_with_path(state.params)
    expected = jax.tree_util.tree_leaves(on_disk["params"])
    targets = jax.tree_util.tree_leaves(abstract.params)
    assert len(restored) == len(expected) == len(targets)
    for (path, leaf), want, target in zip(restored, expected, targets, strict=True):
        name = jax.tree_util.keystr(path)
        assert leaf.sharding.is_equivalent_to(target.sharding, leaf.ndim), name
        np.testing.assert_array_equal(np.asarray(leaf), want, err_msg=name)
    # Training moved the weights between the two checkpoints, so the match is not vacuous.
    earlier = jax.tree_util.tree_leaves(_saved_state(run.workdir, 4)["params"])
    assert any(not np.array_equal(a, b) for a, b in zip(earlier, expected, strict=True))


def test_unchanged_processes_resume_without_an_input_pipeline_warning(
    run, tokenizer, progs, mapped, caplog
):
    """What an unchanged 2-process rerun decides on restoring, played in this process: no
    warning is due; with another share of blocks (another process count), one is."""
    blocks = [len(mapped[p]) for p in range(PROCESSES)]
    for blocks_now, warned in ((blocks, False), ([blocks[0] + 1, blocks[1]], True)):
        position = functools.partial(train._data_position, run.frozen, blocks_now)
        checkpointer = checkpointing.Checkpointer(run.frozen, run.workdir, tokenizer)
        caplog.clear()
        try:
            with caplog.at_level("WARNING"):
                state = train._restore_or_initialize(
                    run.frozen, progs, checkpointer, position, tokenizer
                )
        finally:
            checkpointer.close()
        assert int(jax.device_get(state.step)) == STEPS
        assert ("different input pipeline" in caplog.text) == warned


def test_cli_resumes_the_two_process_checkpoint_in_one_process(run, tmp_path):
    workdir = tmp_path / "resumed"
    shutil.copytree(run.workdir, workdir)  # the other tests keep the 2-process workdir as is
    config = _config(run.config.dataset, num_train_steps=STEPS + 2)
    (result,) = run_main(
        [f"--workdir={workdir}", *run_flags(config)],
        num_processes=1,
        log_dir=tmp_path / "logs",
        timeout=TIMEOUT,
    )
    log = result.stderr
    assert result.returncode == 0, describe([result])
    assert "Process 0 of 1;" in log
    assert f"Restored checkpoint {workdir}/checkpoints/{STEPS} (integrity" in log
    assert "different input pipeline" in log  # expected: 1 process reads other blocks
    assert f"for steps {STEPS}..{STEPS + 2}:" in log
    # One process reads all 16 shards of the corpus the two prepared: nothing built again.
    assert "Reading the prepared corpus" in log and "Preparing" not in log
    # One train/loss row per step: steps 1..STEPS from the 2-process run, then two more.
    lines = [json.loads(x) for x in (workdir / metric_logging.METRICS_FILENAME).open()]
    steps = [row["step"] for row in lines if "train/loss" in row]
    assert steps == list(range(1, STEPS + 3))
    metrics = metric_logging.read_metrics(workdir)
    # Trained weights, not a fresh start: the loss continues from where the run stopped.
    assert metrics[STEPS + 1]["train/loss"] < metrics[1]["train/loss"] - 0.2, metrics
    final = workdir / manifest.CHECKPOINT_DIRNAME / str(STEPS + 2)
    assert manifest.problem_with(epath.Path(final)) is None
    assert int(_saved_state(workdir, STEPS + 2)["step"]) == STEPS + 2


# --- C: bad input fails on every process, quickly -------------------------------------------


_ONE_BATCH_SHARD = ["--config.mesh.ici.fsdp=1", "--config.mesh.ici.tensor=-1"]
_PROCESS_COUNT_ERROR = "batch_size=3 is not divisible by the process count 2"


@pytest.mark.parametrize(
    "overrides,extra_flags,message,late_seconds",
    [
        # 4 rows would fit one process's 4 devices, not the 8 of the 2-process mesh.
        ({"batch_size": 4}, [], "batch_size=4 (per micro-batch 4) is not divisible by the 8", 0),
        ({"batch_size": 3}, _ONE_BATCH_SHARD, _PROCESS_COUNT_ERROR, 0),
        # Process 1 reaches the error 10 s after process 0, which hosts the coordination
        # service: process 0 must wait for it rather than take the service down (process 1
        # then aborted with SIGABRT instead of printing the error).
        ({"batch_size": 3}, _ONE_BATCH_SHARD, _PROCESS_COUNT_ERROR, 10),
    ],
    ids=["batch_shards", "process_count", "process_count_late_peer"],
)
def test_bad_config_stops_every_process_with_one_line(
    corpus, tmp_path, overrides, extra_flags, message, late_seconds
):
    workdir = tmp_path / "run"
    config = _config(corpus, **overrides)
    hook = str(pathlib.Path(__file__).parent / "slow_import")
    late = {1: {"PYTHONPATH": hook, "MAELM_SLOW_TRAIN_IMPORT": str(late_seconds)}}
    results = run_main(
        [f"--workdir={workdir}", *run_flags(config), *extra_flags],
        num_processes=PROCESSES,
        log_dir=tmp_path / "logs",
        timeout=120,
        extra_env=late if late_seconds else None,
    )
    for result in results:
        assert result.returncode == 1, describe(results)
        last_line = result.stderr.strip().splitlines()[-1]
        assert last_line.startswith(f"maelm_jax: error: {message}"), describe(results)
        assert "Traceback" not in result.stderr
    assert not (workdir / manifest.CHECKPOINT_DIRNAME).exists()


def test_input_error_on_one_process_stops_every_process(tmp_path):
    """Process 1's documents are all held out for eval, so it alone has no training tokens."""
    docs = [sample_document(i) for i in range(200)]
    held = [d for d in docs if _held_out(d, 0.1)]
    kept = [d for d in docs if not _held_out(d, 0.1)][: len(held)]
    interleaved = [doc for pair in zip(kept, held, strict=True) for doc in pair]
    config = _config(write_corpus(tmp_path / "corpus", interleaved, files=1))
    data = configdict.freeze(config).data
    assert list(read_documents(data, "train", 1, PROCESSES)) == []
    assert list(read_documents(data, "train", 0, PROCESSES))
    results = run_main(
        [f"--workdir={tmp_path / 'run'}", *run_flags(config)],
        num_processes=PROCESSES,
        log_dir=tmp_path / "logs",
        timeout=60,
    )
    for result in results:
        assert result.returncode == 1, describe(results)
        assert result.stderr.strip().splitlines()[-1].startswith("maelm_jax: error: ")
        assert "Traceback" not in result.stderr
    assert "gave process 1 of 2 no tokens" in results[1].stderr
    assert "process(es) [1] failed while preparing their share" in results[0].stderr
