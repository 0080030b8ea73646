"""`study --preset=gpu` where JAX would run on the CPU alone: refused in one line that says
what the preset is sized for and how to go on, before anything is pretrained; the opt-in
flag passes the check (issue #68). The probe itself, on fake machines, is in
test_accelerator_paths.py."""

import os
import subprocess
import sys

from process_runs import process_env
from tiny_configs import REPO_ROOT


def _study(*args: str) -> tuple[int, str]:
    """The real CLI, with JAX_PLATFORMS=cpu as every test has it: a GPU machine running the
    tests is refused the same way."""
    proc = subprocess.run(
        [sys.executable, "-m", "maelm_jax.study", *args],
        cwd=REPO_ROOT,
        env=process_env(1),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


def test_the_gpu_preset_is_refused_where_jax_runs_on_the_cpu_unless_asked(tmp_path):
    study_dir, no_glue = tmp_path / "study", tmp_path / "no_glue"
    rc, err = _study(f"--study_dir={study_dir}", "--preset=gpu", f"--glue_dir={no_glue}")
    assert rc != 0 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if "maelm_jax.study: error" in x]
    assert "--preset=gpu is sized for one H200 GPU" in line, line
    assert "(JAX_PLATFORMS=cpu)" in line and "more than a day" in line, line
    assert "--preset=cpu" in line and "--allow_slow_preset" in line, line
    assert not os.path.exists(study_dir)  # refused before the study folder or GLUE

    # Asked for, the study goes on past the check to the next one: reading GLUE.
    rc, err = _study(
        f"--study_dir={study_dir}", "--preset=gpu", "--allow_slow_preset", f"--glue_dir={no_glue}"
    )
    assert rc != 0 and "sized for" not in err, err
    (line,) = [x for x in err.splitlines() if "maelm_jax.study: error" in x]
    assert f"GLUE folder {str(no_glue)!r} does not exist" in line, line
