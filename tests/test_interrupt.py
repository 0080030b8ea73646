"""Ctrl-C on a single-process run: the first saves and stops like SIGTERM, a second exits."""

import signal
import subprocess
import sys

from tiny_configs import REPO_ROOT

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
