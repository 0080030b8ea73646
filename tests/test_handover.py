"""The accelerator handover (hardware/handover.py) when it cannot finish: JAX stays on the
CPU, never starting the accelerator again beside the client that leaked; and after it,
training in the same process is refused rather than run on the CPU without a word."""

import subprocess
import sys

import pytest
from process_runs import process_env, users_machine
from tiny_configs import REPO_ROOT

from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import handover

# JAX picks its platforms itself (users_machine drops JAX_PLATFORMS), as on a GPU box; a
# reference to the client stands for whatever a library kept (an executable, a cache).
LEAKED_CLIENT = """
import jax, jax.numpy as jnp
from maelm_jax.hardware import handover
x = jnp.ones(3) * 2
held = jax.devices()[0].client
try:
    handover.to_cpu()
except RuntimeError as e:
    print("raised:", e)
print("platforms:", jax.config.jax_platforms)
print("x deleted:", x.is_deleted())
"""


def test_a_client_that_outlives_the_handover_leaves_jax_on_the_cpu():
    env = users_machine(process_env(1))
    done = subprocess.run(
        [sys.executable, "-c", LEAKED_CLIENT],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("raised: JAX's cpu client outlived") for line in lines), lines
    assert "platforms: cpu" in lines, lines  # was None: the next use started every backend
    assert "x deleted: True" in lines


def test_training_after_an_accelerator_was_handed_over_is_refused(monkeypatch):
    monkeypatch.setattr(handover, "_released", ["cuda"])
    with pytest.raises(ConfigError, match=r"training in W: this process handed JAX's cuda"):
        handover.check_not_handed_over("training in W")
    monkeypatch.setattr(handover, "_released", ["cpu"])  # a CPU-only process lost nothing
    handover.check_not_handed_over("training in W")
