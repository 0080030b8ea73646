"""Ctrl-C on a single-process run: the first saves, stops and exits 130; a second exits."""

import signal
import subprocess
import sys

import run_helpers as rh
from text_corpora import sample_document, write_corpus
from tiny_configs import REPO_ROOT, tiny_run_config

from maelm_jax.training.preemption import EXIT_INTERRUPTED, PreemptionWatcher

TWICE = """
import os, signal, time
from maelm_jax.training.preemption import PreemptionWatcher
watcher = PreemptionWatcher()
os.kill(os.getpid(), signal.SIGINT)
assert watcher.reached(1), "the first Ctrl-C must ask for a checkpoint"
print("first Ctrl-C: stopping at the next step", flush=True)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(30)
"""


def test_the_first_ctrl_c_stops_the_loop_at_the_next_step_like_sigterm():
    before = signal.getsignal(signal.SIGINT)
    watcher = PreemptionWatcher()
    try:
        assert not watcher.reached(1)
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the watcher takes it
        assert watcher.reached(2) and watcher.reason == "SIGINT"
    finally:
        watcher.close()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_exits_at_once_with_one_line():
    result = subprocess.run(
        [sys.executable, "-c", TWICE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=25
    )
    assert result.returncode == EXIT_INTERRUPTED, result.stderr[-3000:]
    assert result.stdout.strip() == "first Ctrl-C: stopping at the next step"
    last = result.stderr.strip().splitlines()[-1]
    assert last == "maelm_jax: error: SIGINT again: stopped without saving"
    assert "Traceback" not in result.stderr


def test_ctrl_c_saves_where_it_stopped_and_exits_130_with_one_line(tmp_path):
    """After the save, exit 130 (128 + SIGINT, the shell's convention), so a script can
    tell a run stopped by hand from a finished one; the earlier checkpoint stays as it was."""
    corpus = write_corpus(tmp_path / "corpus", [sample_document(i) for i in range(160)])
    config = tiny_run_config(
        corpus, num_train_steps=400, checkpoint_every_steps=4, keep_checkpoints=400,
        eval_batches=0, log_every_steps=4,
    )  # fmt: skip
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    proc = rh.start(config, workdir, log)
    try:
        first = rh.wait_for_checkpoint(proc, workdir)
        kept = rh.checksums(rh.step_dirs(workdir)[first])
        proc.send_signal(signal.SIGINT)
    finally:
        status, output = rh.finish(proc, log)
    assert status == EXIT_INTERRUPTED, output[-3000:]
    stopped = max(rh.good_steps(workdir))
    assert first < stopped < config.num_train_steps
    assert output.strip().splitlines()[-1] == (
        f"maelm_jax: error: interrupted (SIGINT): saved a checkpoint at step {stopped} and "
        "stopped; rerun the same command to continue"
    )
    assert "Traceback" not in output, output[-3000:]
    assert rh.checksums(rh.step_dirs(workdir)[first]) == kept
