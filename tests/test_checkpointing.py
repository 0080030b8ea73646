"""Checkpoints a preempted job can trust, tested with real subprocesses and real files.

One uninterrupted in-process run (`baseline`) is the reference: its metrics.jsonl holds
every step's loss and its workdir the checkpoints the restore and corruption tests read.
Interrupted runs are real `python -m maelm_jax.main` processes (kill -9, SIGTERM, a NaN, a
disk that refuses writes); their reruns happen in-process because only the restored state,
not the process, is under test there. Every run uses the (data=2, fsdp=2, tensor=2) mesh,
so each checkpoint is written from arrays sharded over all three axes.
"""

import ast
import asyncio
import gc
import json
import logging
import pathlib
import re
import shutil
import signal
import sys
import threading
import time

import jax
import numpy as np
import pytest
import run_helpers as rh
import tensorstore as ts
from etils import epath
from orbax.checkpoint._src.path import async_path  # a real Orbax coroutine
from orbax.checkpoint._src.serialization import limits, serialization
from text_corpora import sample_document, write_corpus
from tiny_configs import tiny_run_config

from maelm_jax.checkpoints import abandoned_reads, manifest, save_errors
from maelm_jax.checkpoints import integrity as checkpoint_integrity
from maelm_jax.checkpoints.checkpointing import Checkpointer
from maelm_jax.checkpoints.params import load_params
from maelm_jax.checkpoints.save_errors import NonFiniteStateError
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.tokenizer import BOS_ID, FIRST_REGULAR_ID
from maelm_jax.step import programs, sharding
from maelm_jax.training import metric_logging

STEPS = 32
EVERY = 8
MESH_222 = {"mesh.ici.data": 2, "mesh.ici.fsdp": 2, "mesh.ici.tensor": 2}


def run_config(corpus, **overrides):
    """The tiny run every test shares: long enough that a signal sent after the first
    checkpoint lands well before the end; no eval, whose compile would only cost time."""
    settings = dict(MESH_222, num_train_steps=STEPS, checkpoint_every_steps=EVERY, eval_batches=0)
    return tiny_run_config(corpus, **(settings | overrides))


def mesh_config(corpus, shape, **overrides):
    """`run_config` on a (data, fsdp, tensor) = `shape` mesh."""
    axes = {f"mesh.ici.{a}": n for a, n in zip(sharding.MESH_AXES, shape, strict=True)}
    return run_config(corpus, **(axes | overrides))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = [sample_document(i) for i in range(240)]
    return write_corpus(tmp_path_factory.mktemp("corpus"), docs)


@pytest.fixture(scope="module")
def baseline(corpus, tmp_path_factory):
    """(workdir, {step: loss}) of the uninterrupted reference run."""
    workdir = tmp_path_factory.mktemp("baseline")
    rh.train_in_process(run_config(corpus), workdir)
    losses = rh.losses(workdir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert rh.good_steps(workdir) == [STEPS - 2 * EVERY, STEPS - EVERY, STEPS]
    return workdir, losses


def copy_workdir(source, target, keep_steps=None):
    """`source` without its metrics (so a rerun's lines stand alone) and, if given, only the
    checkpoints of `keep_steps`: a workdir as a run that got that far would have left it."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("metrics.jsonl", "events.*"))
    if keep_steps is not None:
        for step, path in rh.step_dirs(target).items():
            if step not in keep_steps:
                path.rmtree()
    return target


def error_line(output):
    """The one line `main` prints for an error it reports (Orbax's background threads may
    still be printing around it)."""
    lines = [line for line in output.splitlines() if line.startswith("maelm_jax: error: ")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def tokenizer_of(workdir):
    return tokenizer_lib.Tokenizer.from_path(epath.Path(workdir) / tokenizer_lib.MODEL_FILENAME)


def leaves(tree):
    return jax.tree_util.tree_leaves_with_path(jax.device_get(tree))


def assert_trees_equal(actual, expected, what):
    for (path, a), (_, b) in zip(leaves(actual), leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=f"{what} {jax.tree_util.keystr(path)}")


# --- 1, 2: kill -9 and SIGTERM mid-run ------------------------------------------------------


def interrupted_run(config, workdir, sig):
    """Starts the CLI, sends `sig` as soon as its first checkpoint is committed, and returns
    (exit status, output, committed step it was signalled after)."""
    log = epath.Path(workdir).parent / f"{epath.Path(workdir).name}.log"
    proc = rh.start(config, workdir, log)
    try:
        first = rh.wait_for_checkpoint(proc, workdir)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be signalled; raise STEPS ({STEPS})")
        proc.send_signal(sig)
    finally:
        status, output = rh.finish(proc, log)
    return status, output, first


def test_kill_9_then_rerun_matches_an_uninterrupted_run_bit_for_bit(corpus, baseline, tmp_path):
    """Every step after the resume, and every step the killed run logged before, has exactly
    the baseline's loss: the restored params, optimizer state, step and data position are
    the ones the uninterrupted run had, and nothing depends on the process that ran it."""
    _, expected = baseline
    config, workdir = run_config(corpus), tmp_path / "run"
    status, output, _ = interrupted_run(config, workdir, signal.SIGKILL)
    assert status == -signal.SIGKILL, output[-3000:]
    resume = rh.good_steps(workdir)[-1]
    assert resume < STEPS
    before = rh.losses(workdir)
    assert {s: expected[s] for s in before} == before  # the killed run itself

    rerun = rh.train_in_process(config, workdir)
    assert sorted(rerun) == list(range(resume + 1, STEPS + 1))
    assert rerun == {s: expected[s] for s in rerun}
    assert rh.losses(workdir) == expected
    assert rh.good_steps(workdir)[-1] == STEPS


def test_sigterm_saves_where_it_stopped_and_the_rerun_goes_on_from_there(
    corpus, baseline, tmp_path
):
    """A preempted job gets SIGTERM and a grace period: it must checkpoint the step it is
    at and exit 0, and its rerun must pick up exactly there."""
    _, expected = baseline
    config, workdir = run_config(corpus), tmp_path / "run"
    status, output, first = interrupted_run(config, workdir, signal.SIGTERM)
    assert status == 0, output[-3000:]
    found = re.search(r"Preempted \(SIGTERM\): saved a checkpoint at step (\d+)", output)
    assert found, output[-3000:]
    stopped = int(found.group(1))
    assert first < stopped < STEPS
    # The step it stopped at is checkpointed, complete, and the newest.
    assert rh.good_steps(workdir)[-1] == stopped
    assert max(rh.step_dirs(workdir)) == stopped
    assert max(rh.losses(workdir)) == stopped

    rerun = rh.train_in_process(config, workdir)
    assert min(rerun) == stopped + 1
    assert rerun == {s: expected[s] for s in range(stopped + 1, STEPS + 1)}
    assert rh.good_steps(workdir)[-1] == STEPS


# --- 3: a corrupt latest checkpoint -------------------------------------------------------


def _largest_file(directory):
    files = [p for p in pathlib.Path(directory).rglob("*") if p.is_file()]
    return max(files, key=lambda p: p.stat().st_size)


def relative_paths(directory):
    root = pathlib.Path(directory)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def drop_commit_marker(step_dir):
    (step_dir / manifest.ORBAX_COMMIT).unlink()
    return "no commit_success.txt: the save never finished"


def truncate_array_file(step_dir):
    path = _largest_file(step_dir / "state" / "ocdbt.process_0")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    name = path.relative_to(step_dir)
    return f"file {name} has {len(data) // 2} bytes, {len(data)} were written"


def delete_array_file(step_dir):
    path = _largest_file(step_dir / "state" / "d")
    path.unlink()
    return f"file {path.relative_to(step_dir)} is missing"


def _overwrite_middle(path, every=None):
    """Same-size damage: bytes of `path` replaced by different ones (the middle 16 by 0xff,
    which is not UTF-8, as random bytes mostly are not; or one in `every` all along it)."""
    data = bytearray(path.read_bytes())
    if every:
        for i in range(100, len(data) - 100, every):
            data[i] ^= 0x5A
    else:
        data[len(data) // 2 - 8 : len(data) // 2 + 8] = b"\xff" * 16
    path.write_bytes(bytes(data))


def overwrite_array_bytes(step_dir):
    """Bytes changed all along the array data files, their sizes kept. Whether Orbax's read
    fails (a compressed block no longer decodes) or returns other numbers depends on which
    bytes it meets first; either way the step must be skipped."""
    for path in (step_dir / "state" / "ocdbt.process_0" / "d").iterdir():
        _overwrite_middle(path, every=997)
    return None


def mismatch_integrity_record(step_dir):
    """Arrays that read back as other numbers than were saved, without a read error: the
    record (the manifest) and the bytes disagree, which only the record can reveal."""
    manifest_path = step_dir / manifest.MANIFEST
    record = json.loads(manifest_path.read_text())
    name = sorted(n for n in record["arrays"] if n.startswith("params/"))[0]
    record["arrays"][name] = [(v + 1) % 2**32 for v in record["arrays"][name]]
    manifest_path.write_text(json.dumps(record))
    return f"array {name} does not match its integrity record"


METADATA_FILES = [
    "_CHECKPOINT_METADATA",
    "state/_METADATA",
    "state/_sharding",
    "state/manifest.ocdbt",
    "state/array_metadatas/process_0",
    "data/metadata",
]


def overwrite_metadata(name):
    def corrupt(step_dir):
        _overwrite_middle(step_dir / name)
        if name == "_CHECKPOINT_METADATA":
            return "unreadable _CHECKPOINT_METADATA (UnicodeDecodeError"
        return f"file {name} was changed after it was written (sha256 differs)"

    corrupt.__name__ = f"overwrite_{name.replace('/', '_')}"
    return corrupt


def corrupt_latest(source, target, corrupt):
    """A copy of workdir `source` whose newest checkpoint `corrupt` damaged: (workdir, the
    damaged directory, the warning a resuming run must give, the damaged file list)."""
    workdir = copy_workdir(source, target)
    bad = pathlib.Path(rh.step_dirs(workdir)[STEPS])
    reason = corrupt(bad)
    # The reason given, or its start where it depends on which bytes Orbax reads first.
    warning = f"Checkpoint {bad} is incomplete or corrupt ({reason or ''}"
    return workdir, bad, warning, relative_paths(bad)


def set_aside(workdir, step):
    """The directories checkpoint `step` was renamed to."""
    return [p for p in (workdir / "checkpoints").iterdir() if p.name.startswith(f"{step}.")]


@pytest.mark.parametrize(
    "corrupt",
    [drop_commit_marker, truncate_array_file, delete_array_file, overwrite_array_bytes]
    + [mismatch_integrity_record]
    + [overwrite_metadata(name) for name in METADATA_FILES],
    ids=lambda corrupt: corrupt.__name__,
)
def test_a_corrupt_latest_checkpoint_is_skipped_with_a_warning_and_kept_aside(
    corpus, baseline, restored, tmp_path, caplog, corrupt
):
    """Restoring names the problem, returns the step before, and renames (never deletes)
    the bad directory so a post-mortem can still read it and the step can be written anew."""
    workdir, bad, warning, bad_files = corrupt_latest(baseline[0], tmp_path / "run", corrupt)
    _, progs = restored[8]
    with caplog.at_level("WARNING"):
        state, _ = restore(run_config(corpus), workdir, progs)
    assert warning in caplog.text
    assert int(state.step) == STEPS - EVERY
    moved = set_aside(workdir, STEPS)
    assert [p.name.split("-")[0] for p in moved] == [f"{STEPS}.unusable"]
    assert relative_paths(moved[0]) == bad_files
    assert not bad.exists()


@pytest.mark.parametrize(
    "corrupt",
    [overwrite_array_bytes, mismatch_integrity_record, overwrite_metadata("_CHECKPOINT_METADATA")],
    ids=lambda corrupt: corrupt.__name__,
)
def test_after_a_corrupt_checkpoint_the_rerun_trains_on_from_the_previous_one(
    corpus, baseline, tmp_path, caplog, corrupt
):
    """End to end: the rerun's losses are the baseline's from the previous step on, and it
    writes the set-aside step again, complete."""
    source, expected = baseline
    workdir, _, warning, _ = corrupt_latest(source, tmp_path / "run", corrupt)
    with caplog.at_level("WARNING"):
        rerun = rh.train_in_process(run_config(corpus), workdir)
    assert warning in caplog.text
    assert sorted(rerun) == list(range(STEPS - EVERY + 1, STEPS + 1))
    assert rerun == {s: expected[s] for s in rerun}
    assert len(set_aside(workdir, STEPS)) == 1
    assert rh.good_steps(workdir)[-1] == STEPS


def flip_256_bytes(step_dir):
    """What an outside fault harness did: 256 bytes of array data inverted, sizes kept. Here
    they are each data file's first 256 (its zstd frame header): in these tiny checkpoints
    the middle of a data file is never read (measured), and a flip that is read must make
    the read itself fail, not only give other numbers (`mismatch_integrity_record`)."""
    for path in (step_dir / "state" / "ocdbt.process_0" / "d").iterdir():
        data = path.read_bytes()
        path.write_bytes(bytes(b ^ 0xFF for b in data[:256]) + data[256:])


def test_a_recovered_corrupt_checkpoint_says_so_in_one_line_without_a_traceback(
    corpus, baseline, tmp_path
):
    """The CLI, resumed onto a newest checkpoint whose arrays fail to read: it must finish,
    and print nothing that looks like a crash (no traceback, no "Exception ignored" from the
    failed restore's abandoned read coroutines), and one line naming the bad step, the
    reason, where it was moved and the step restored instead."""
    workdir = copy_workdir(baseline[0], tmp_path / "run")
    checkpoints = workdir / "checkpoints"
    flip_256_bytes(checkpoints / str(STEPS))
    status, output = rh.run(run_config(corpus, num_train_steps=STEPS + 2), workdir)
    assert status == 0, output[-3000:]
    assert "Traceback" not in output, output[-6000:]
    assert "Exception ignored" not in output, output[-6000:]
    assert "Task was destroyed" not in output, output[-6000:]
    (moved,) = set_aside(workdir, STEPS)
    recovery = [line for line in output.splitlines() if f"{checkpoints / str(STEPS)}" in line]
    assert len(recovery) == 1, "\n".join(recovery)
    assert re.search(
        rf"Checkpoint {checkpoints / str(STEPS)} is incomplete or corrupt \(unreadable: .+\): "
        rf"moved it to {moved} and restored {checkpoints / str(STEPS - EVERY)} instead$",
        recovery[0],
    ), recovery[0]
    assert "TensorStore" not in recovery[0]  # the cause, not Orbax's wrapper with the spec
    assert sorted(rh.losses(workdir)) == list(range(STEPS - EVERY + 1, STEPS + 3))
    assert rh.good_steps(workdir)[-1] == STEPS + 2


def _hanging_store(released: threading.Event, entered: threading.Event):
    """A real TensorStore of 4 x 2 float32 whose reads wait for `released`."""

    def read(domain, array, params):
        del params
        entered.set()
        released.wait(60)
        array[...] = np.ones(domain.shape, np.float32)

    return ts.virtual_chunked(
        read, dtype=ts.float32, shape=[4, 2], chunk_layout=ts.ChunkLayout(read_chunk_shape=[2, 2])
    )


def test_reads_abandoned_by_a_failed_restore_are_ended_without_a_report(monkeypatch):
    """Orbax's own shard reads, left in flight on an event loop closed under them as
    `run_sync` leaves them when a sibling read fails: collected, each reports an
    "Exception ignored" with TensorStore's spec; ended by `ended_on_failure`, none do, and
    other unraisable exceptions still reach the hook."""
    reported = []  # (message, from an Orbax coroutine): a traceback would keep reads alive

    def hook(unraisable):
        reported.append(
            (str(unraisable.exc_value), abandoned_reads._orbax_coroutine(unraisable.object))
        )

    monkeypatch.setattr(sys, "unraisablehook", hook)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
    halves = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    held = []  # the task, as Orbax's gather holds it until the failure

    def abandon_reads():
        released, entered = threading.Event(), threading.Event()
        loop = asyncio.new_event_loop()
        read = serialization._read_and_create_array(
            _hanging_store(released, entered), global_shape=(4, 2), new_shard_shape=(2, 2),
            sharding=halves, dtype=np.float32, byte_limiter=limits.get_byte_limiter(),
            strict=True, dll=None,
        )  # fmt: skip
        held.append(loop.create_task(read))
        while not entered.is_set():
            loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()  # as Orbax's run_sync does once the gather has raised
        return released

    def collect(released):
        """Lets TensorStore finish the reads (for the closed loop), then collects them."""
        held.clear()
        released.set()
        deadline = time.monotonic() + 60
        while [m for m, _ in reported].count(_CLOSED_LOOP) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        gc.collect()

    collect(abandon_reads())  # what Python does with them unless they are ended
    abandoned = [message for message, orbax in reported if orbax]
    assert len(abandoned) == 2 and "TensorStore" in abandoned[0], reported

    reported.clear()
    with pytest.raises(OSError), abandoned_reads.ended_on_failure():
        released = abandon_reads()
        _RaisesWhenCollected(lambda: 1 / 0)  # not a read: reported
        raise OSError("a read failed")
    assert len(reported) == 1
    collect(released)
    assert [message for message, _ in reported if message != _CLOSED_LOOP] == ["division by zero"]


# TensorStore finishing a read for a closed loop reports this (`main`'s hook drops it).
_CLOSED_LOOP = "Event loop is closed"


# --- 4: restore on another mesh --------------------------------------------------------------


def build(config, devices, vocab_size):
    run = configdict.freeze(config)
    return programs.build(run, sharding.create_mesh(run.mesh, devices=devices), vocab_size)


def restore(config, workdir, progs):
    """(state, data position) from the newest good checkpoint of `workdir`, onto `progs`'
    mesh, the way a resuming run calls it."""
    abstract = progs.abstract_state()
    checkpointer = Checkpointer(configdict.freeze(config), workdir, tokenizer_of(workdir))
    try:
        with sharding.activate(progs.mesh, progs.rules):
            return checkpointer.restore_latest(abstract)
    finally:
        checkpointer.close()


@pytest.fixture(scope="module")
def restored(corpus, baseline):
    """{device count: (state, programs)}: the baseline's last checkpoint restored on 8
    devices as (2, 2, 2), on 2 as (1, 2, 1) and on 1."""
    workdir, _ = baseline
    out = {}
    for shape in [(2, 2, 2), (1, 2, 1), (1, 1, 1)]:
        count = int(np.prod(shape))
        config = mesh_config(corpus, shape)
        progs = build(config, jax.devices()[:count], tokenizer_of(workdir).vocab_size)
        state, _ = restore(config, workdir, progs)
        assert int(state.step) == STEPS
        out[count] = (state, progs)
    return out


@pytest.mark.parametrize("count", [2, 1])
def test_a_checkpoint_saved_on_8_devices_restores_identically_on_fewer(restored, count):
    """Values equal to the (2, 2, 2) restore, and every array really laid out as the target
    mesh says: on those devices only, each holding the shard its sharding names."""
    state, progs = restored[count]
    reference, _ = restored[8]
    assert_trees_equal(state, reference, f"{count} devices")
    devices = set(jax.devices()[:count])
    for (path, leaf), target in zip(
        jax.tree_util.tree_leaves_with_path(state),
        jax.tree_util.tree_leaves(progs.state_shardings),
        strict=True,
    ):
        where = jax.tree_util.keystr(path)
        assert leaf.sharding == target, where
        assert {shard.device for shard in leaf.addressable_shards} == devices, where
        for shard in leaf.addressable_shards:
            assert shard.data.shape == target.shard_shape(leaf.shape), where
    if count == 2:  # fsdp=2 really splits the embedding between the two devices
        embedding = state.params["token_embed"]["embedding"]
        assert embedding.addressable_shards[0].data.shape[1] == embedding.shape[1] // 2


# --- 5: a checkpoint that does not fit the model --------------------------------------------

_SHAPES = re.compile(
    r"parameter '(?P<name>[^']+)' has shape (?P<saved>\([\d, ]*\)) in the checkpoint but "
    r"(?P<model>\([\d, ]*\)) in the model"
)


def _shape_at(params, name):
    for key in name.split("/"):
        params = params[key]
    return tuple(params.shape)


@pytest.mark.parametrize(
    "change,saved_dim,model_dim",
    [({"model.num_layers": 3}, 2, 3), ({"model.hidden_size": 64, "model.mlp_dim": 128}, 32, 64)],
    ids=["layers", "width"],
)
@pytest.mark.parametrize("way_in", ["resume", "init_from"])
def test_a_different_architecture_is_an_error_naming_the_parameter(
    corpus, baseline, restored, change, saved_dim, model_dim, way_in
):
    """Both ways into a checkpoint refuse it, naming a parameter with its two real shapes;
    a misfit is a hard error, never mistaken for corruption and renamed."""
    workdir, _ = baseline
    saved_params = restored[8][0].params
    config = run_config(corpus, **change)
    progs = build(config, jax.devices(), tokenizer_of(workdir).vocab_size)
    before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    with pytest.raises(ConfigError) as error:
        if way_in == "resume":
            restore(config, workdir, progs)
        else:
            load_params(str(workdir), progs.abstract_state().params)
    found = _SHAPES.search(str(error.value))
    assert found, str(error.value)
    name = found.group("name")
    assert found.group("saved") == str(_shape_at(saved_params, name))
    assert found.group("model") == str(_shape_at(progs.abstract_state().params, name))
    saved, wanted = (ast.literal_eval(found.group(k)) for k in ("saved", "model"))
    assert saved_dim in saved and model_dim in wanted
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before


# --- 6: a NaN at a chosen step -----------------------------------------------------------------


def test_nan_with_stop_exits_non_zero_naming_the_step_and_keeps_the_last_good_checkpoint(
    corpus, tmp_path
):
    """log_every_steps=5 leaves the bad step's metrics unread when its checkpoint (8, the
    state after step 7) falls due: the run must check them first and never save it."""
    bad = 7
    config = run_config(corpus, inject_nan_at_step=bad, checkpoint_every_steps=4, log_every_steps=5)
    workdir = tmp_path / "run"
    status, output = rh.run(config, workdir)
    assert status == 1, output[-3000:]
    message = f"maelm_jax: error: non-finite loss or gradient at step {bad} "
    assert error_line(output).startswith(message), output[-3000:]
    assert [p.name for p in (workdir / "checkpoints").iterdir()] == ["4"]
    assert rh.good_steps(workdir) == [4]


def _batch(seed, vocab_size):
    rows = np.random.default_rng(seed).integers(FIRST_REGULAR_ID, vocab_size, (8, 32))
    rows[:, 0] = BOS_ID
    return rows.astype(np.int32)


def test_nan_with_skip_keeps_params_and_optimizer_state_for_that_step(corpus):
    config = mesh_config(corpus, (1, 1, 1), nonfinite="skip", inject_nan_at_step=1)
    progs = build(config, jax.devices()[:1], config.vocab_size)
    state = progs.initialize(jax.random.PRNGKey(0))
    history, nonfinite = [jax.device_get(state)], []
    with sharding.activate(progs.mesh, progs.rules):
        for step in range(3):  # step 0 has learning rate 0 (warmup): watch steps 1 and 2
            batch = progs.global_batch(_batch(step, config.vocab_size))
            state, metrics = progs.train_step(state, batch)
            history.append(jax.device_get(state))
            nonfinite.append(int(metrics["nonfinite"]))
    assert nonfinite == [0, 1, 0]
    assert [int(s.step) for s in history] == [0, 1, 2, 3]
    assert [int(s.skipped_updates) for s in history] == [0, 0, 1, 1]
    before, after, later = history[1:]
    assert_trees_equal(after.params, before.params, "params")
    assert_trees_equal(after.opt_state, before.opt_state, "opt_state")
    for (path, a), (_, b) in zip(leaves(later.params), leaves(after.params), strict=True):
        assert not np.array_equal(a, b), f"the step after the skip left {path} unchanged"


def test_nan_with_skip_trains_to_the_end(corpus, baseline, tmp_path):
    """The skipped step is counted in the metrics and the state; the steps before it are
    exactly the baseline's and training reaches num_train_steps with finite losses."""
    _, expected = baseline
    bad = 10
    config = run_config(corpus, nonfinite="skip", inject_nan_at_step=bad)
    workdir = tmp_path / "run"
    losses = rh.train_in_process(config, workdir)
    # The skipped step's log line has no loss to report (not a fake 0.0).
    assert sorted(losses) == [s for s in range(1, STEPS + 1) if s != bad + 1]
    assert all(losses[s] == expected[s] for s in range(1, bad + 1))
    assert all(np.isfinite(list(losses.values())))
    rows = metric_logging.read_metrics(workdir)
    assert [s for s in rows if rows[s].get("skipped_updates")] == [bad + 1]
    progs = build(config, jax.devices(), tokenizer_of(workdir).vocab_size)
    state, _ = restore(config, workdir, progs)
    assert int(state.step) == STEPS and int(state.skipped_updates) == 1


# --- 7: init_from ------------------------------------------------------------------------------


def test_init_from_starts_at_step_0_with_the_weights_and_a_fresh_optimizer(
    corpus, baseline, restored, tmp_path
):
    """A one-step run whose only update is skipped (an injected NaN under nonfinite="skip"
    keeps params and optimizer state) checkpoints exactly the state init_from produced."""
    source, _ = baseline
    other, progs = restored[8]
    config = run_config(
        corpus,
        init_from=str(source),
        num_train_steps=1,
        checkpoint_every_steps=1,
        nonfinite="skip",
        inject_nan_at_step=0,
    )
    workdir = tmp_path / "run"
    rh.train_in_process(config, workdir)
    rows = metric_logging.read_metrics(workdir)
    assert sorted(rows) == [1] and rows[1]["skipped_updates"] == 1  # from step 0, not 32
    state, _ = restore(config, workdir, progs)
    assert int(state.step) == 1 and int(state.skipped_updates) == 1
    assert_trees_equal(state.params, other.params, "params")
    for path, leaf in leaves(state.opt_state):  # Adam's count and both moments
        assert not np.any(leaf), jax.tree_util.keystr(path)
    assert any(np.any(leaf) for _, leaf in leaves(other.opt_state))


def test_init_from_places_the_weights_in_this_runs_shardings(baseline, restored):
    """Fine-tuning on another mesh than pretraining: load_params reshards as it reads."""
    source, _ = baseline
    other, _ = restored[8]
    _, progs = restored[2]
    params = load_params(str(source), progs.abstract_state().params)
    assert_trees_equal(params, other.params, "params")
    for leaf, target in zip(
        jax.tree_util.tree_leaves(params),
        jax.tree_util.tree_leaves(progs.state_shardings.params),
        strict=True,
    ):
        assert leaf.sharding == target


def test_a_workdir_with_its_own_checkpoint_resumes_and_ignores_init_from(
    corpus, baseline, tmp_path
):
    """A preempted fine-tuning job must go on from its own step, not start over from the
    weights it was initialised with: its losses continue the run that wrote the step."""
    source, expected = baseline
    first = STEPS - 2 * EVERY
    workdir = copy_workdir(source, tmp_path / "run", keep_steps=[first])
    config = run_config(corpus, init_from=str(source / "checkpoints" / str(STEPS)))
    rerun = rh.train_in_process(config, workdir)
    assert sorted(rerun) == list(range(first + 1, STEPS + 1))
    assert rerun == {s: expected[s] for s in rerun}


# --- Retention -----------------------------------------------------------------------------


def test_keeps_the_last_checkpoints_and_every_milestone(corpus, tmp_path):
    """keep_checkpoints=2 of the every-4-steps saves, plus every multiple of 8 for good."""
    config = run_config(
        corpus, num_train_steps=20, checkpoint_every_steps=4, keep_checkpoints=2,
        keep_every_steps=8,
    )  # fmt: skip
    rh.train_in_process(config, tmp_path)
    assert rh.good_steps(tmp_path) == [8, 16, 20]


# --- Asynchronous save errors --------------------------------------------------------------

# Below every checkpoint's largest files (the tokenizer as JSON, ~330 KB; the arrays, ~400
# KB), above every file a resumed run writes before its first save (its metrics lines).
_FILE_SIZE_LIMIT = 200_000


def test_a_failed_background_save_stops_the_run_with_one_line_and_keeps_the_last_checkpoint(
    corpus, baseline, tmp_path
):
    """A file-size limit (`ulimit -f`) makes Orbax's background writes fail with EFBIG, as
    a full disk would (chmod cannot: the tests run as root). A run resumed from step 16
    must stop by its next save (how many steps the failure takes to surface depends on the
    machine's load) with the error as its last line, print no traceback (Orbax logs one per
    failed thread), write no later checkpoint, and leave checkpoint 16 as it was."""
    workdir = copy_workdir(baseline[0], tmp_path / "run", keep_steps=[STEPS - 2 * EVERY])
    kept = rh.checksums(rh.step_dirs(workdir)[STEPS - 2 * EVERY])
    limit = ["bash", "-c", f'ulimit -f {_FILE_SIZE_LIMIT // 1024} && exec "$0" "$@"']
    status, output = rh.run(run_config(corpus), workdir, prefix=limit)
    assert status == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last == error_line(output), output[-3000:]
    assert last.startswith("maelm_jax: error: saving "), last
    assert "File too large" in last
    assert "Traceback" not in output, output[-3000:]
    # The other writes' late failures (how many depends on thread timing) stay off stderr.
    assert "Event loop is closed" not in output
    assert "Task exception was never retrieved" not in output
    assert rh.good_steps(workdir) == [STEPS - 2 * EVERY]
    assert rh.checksums(rh.step_dirs(workdir)[STEPS - 2 * EVERY]) == kept
    assert STEPS - 2 * EVERY < max(rh.losses(workdir)) <= STEPS


def test_orbax_errors_are_logged_as_one_line_and_others_keep_their_traceback(
    monkeypatch, capsys, tmp_path
):
    """What `main` installs keeps Orbax's error lines, with the exception's first line, and
    drops their tracebacks; an error logged from anywhere else keeps its traceback."""
    absl_logger = logging.getLogger("absl")
    monkeypatch.setattr(absl_logger, "filters", list(absl_logger.filters))
    save_errors.silence_writes_after_a_failed_save()
    handler = logging.StreamHandler(sys.stdout)
    absl_logger.addHandler(handler)
    try:
        for source in ("/site-packages/orbax/checkpoint/_src/futures/future.py", __file__):
            try:
                raise OSError(27, "File too large")
            except OSError:
                record = absl_logger.makeRecord(
                    "absl", logging.ERROR, source, 1, "save of %s failed", ("state",),
                    sys.exc_info(),
                )  # fmt: skip
            absl_logger.handle(record)
    finally:
        absl_logger.removeHandler(handler)
    orbax, other = capsys.readouterr().out.split("save of state failed", 2)[1:]
    assert orbax == " (OSError: [Errno 27] File too large)\n"
    assert "Traceback" in other and "OSError: [Errno 27] File too large" in other


class _RaisesWhenCollected:
    def __init__(self, action):
        self.action = action

    def __del__(self):
        self.action()


def test_only_the_echoes_of_a_failed_save_are_silenced(monkeypatch, caplog, tmp_path):
    """What `main` installs drops the closed-loop callbacks and unretrieved write errors of
    a failed save, and lets every other unraisable exception and asyncio error through."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable))
    asyncio_logger = logging.getLogger("asyncio")
    monkeypatch.setattr(asyncio_logger, "filters", list(asyncio_logger.filters))
    save_errors.silence_writes_after_a_failed_save()

    closed_loop = asyncio.new_event_loop()
    closed_loop.close()
    _RaisesWhenCollected(lambda: closed_loop.call_soon_threadsafe(print))
    assert reported == []
    _RaisesWhenCollected(lambda: closed_loop.call_soon(print))  # not a late write callback
    _RaisesWhenCollected(lambda: 1 / 0)
    assert [str(u.exc_value) for u in reported] == ["Event loop is closed", "division by zero"]

    async def own_write(path, data):
        path.write_bytes(data)

    missing = epath.Path(tmp_path) / "missing"  # both writes fail: no such directory
    for write in (async_path.write_bytes, own_write):  # Orbax's async write, then not Orbax's
        loop = asyncio.new_event_loop()
        task = loop.create_task(write(missing / "x", b""))
        loop.run_until_complete(asyncio.wait([task]))  # waits, leaves the error unretrieved
        del task
        loop.close()
    gc.collect()  # an unretrieved task's error is logged when the task is collected
    unretrieved = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(unretrieved) == 1 and "own_write" in unretrieved[0], unretrieved


# --- 8: the integrity record, a non-finite state, another tokenizer ---------------------------


def _flip_one_bit(tree, name):
    """`tree` with one bit of leaf `name` flipped, in the leaf's own sharding."""

    def flip(path, leaf):
        if checkpoint_integrity._keystr(path) != name:
            return leaf
        bits = np.array(jax.device_get(leaf)).view(np.uint32)
        bits.flat[bits.size // 2] ^= 1
        return jax.device_put(bits.view(leaf.dtype), leaf.sharding)

    return jax.tree_util.tree_map_with_path(flip, tree)


def test_the_integrity_record_sees_one_flipped_bit_whatever_the_sharding(restored):
    """The record of the same values on 8 devices and on 1 is the same; one bit flipped in
    one array changes that array's entry only."""
    on_8, on_1 = restored[8][0].params, restored[1][0].params
    record_8, finite = checkpoint_integrity.record(on_8)
    assert finite and record_8 == checkpoint_integrity.record(on_1)[0]
    name = sorted(record_8)[len(record_8) // 2]
    flipped, _ = checkpoint_integrity.record(_flip_one_bit(on_8, name))
    assert [n for n in record_8 if record_8[n] != flipped[n]] == [name]
    assert checkpoint_integrity.first_mismatch(record_8, flipped).startswith(f"array {name} ")


def test_a_state_that_is_not_finite_is_never_saved(corpus, baseline, restored, tmp_path):
    state, _ = restored[8]
    name = sorted(checkpoint_integrity.record(state.params)[0])[0]
    nan_state = state.replace(
        params=jax.tree_util.tree_map_with_path(
            lambda p, x: x * np.nan if checkpoint_integrity._keystr(p) == name else x,
            state.params,
        )
    )
    checkpointer = Checkpointer(
        configdict.freeze(run_config(corpus)), tmp_path, tokenizer_of(baseline[0])
    )
    try:
        with pytest.raises(NonFiniteStateError, match="the state at step 33 has non-finite"):
            checkpointer.save(33, nan_state, {}, force=True)
    finally:
        checkpointer.close()
    assert rh.step_dirs(tmp_path) == {}


def test_another_tokenizer_is_refused_on_resume_and_on_init_from(
    corpus, baseline, restored, tmp_path
):
    """A same-size vocabulary fits the model, so only the tokenizer's fingerprint tells."""
    texts = [f"Completely different words, sentence number {i}." for i in range(300)]
    other = tokenizer_lib.Tokenizer(tokenizer_lib.train(texts, 300))
    saved = tokenizer_of(baseline[0]).fingerprint
    _, progs = restored[8]
    workdir = copy_workdir(baseline[0], tmp_path / "run")
    checkpointer = Checkpointer(configdict.freeze(run_config(corpus)), workdir, other)
    try:
        with sharding.activate(progs.mesh, progs.rules), pytest.raises(ConfigError) as resumed:
            checkpointer.restore_latest(progs.abstract_state())
    finally:
        checkpointer.close()
    with pytest.raises(ConfigError) as initialised:
        load_params(str(baseline[0]), progs.abstract_state().params, other.fingerprint)
    for error in (resumed.value, initialised.value):
        assert f"trained with tokenizer sha256 {saved} but this run's tokenizer" in str(error)
        assert f"is sha256 {other.fingerprint}" in str(error)
    assert rh.good_steps(workdir) == rh.good_steps(baseline[0])  # nothing set aside
