"""`study` where it met faults (issue #68): inside a cluster environment of one process (a
single-task SLURM job, `mpirun -np 1`, a one-host Cloud TPU VM, an explicit job of one) it
runs to its table and a rerun finds every stage done; sent SIGTERM during a pretraining it
stops there, saved, with no marker and no later stage, and the rerun finishes the steps."""

import json
import re
import signal
import sys

import pytest
import run_helpers as rh
from process_runs import free_port
from test_study import CONFIG, _one_line, _sst2, _study

from maelm_jax.hardware import distributed
from maelm_jax.training import preemption

# A one-host TPU VM as JAX's GceTpuCluster reads it: on a TPU VM (its flag set where libtpu
# finds chips), metadata that names this host worker 0 of a slice of one. Faked at JAX's own
# `get_metadata`, the one call that would reach the metadata server.
FAKE_TPU_VM = """
import os, runpy, sys
from jax._src.clusters import cloud_tpu_cluster as tpu
META = {"agent-worker-number": "0", "worker-network-endpoints": "t1v-n-0-w-0:0:127.0.0.1",
        "tpu-env": "ACCELERATOR_TYPE: 'v5p-8'"}
tpu.running_in_cloud_tpu_vm = True
tpu.get_metadata = lambda key: (META[key], 200) if key in META else ("", 404)
os.environ.pop("TPU_SKIP_MDS_QUERY", None)
runpy.run_module("maelm_jax.study", run_name="__main__", alter_sys=True)
"""

SLURM_OF_ONE = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
}  # fmt: skip
OMPI_OF_ONE = {
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://127.0.0.1:34911",
    "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
}  # fmt: skip


def _micro_study(tmp_path, steps: int, every: int) -> tuple[list[str], object]:
    config = tmp_path / "mlm.py"
    text = CONFIG.format(objective="mlm").replace(
        "c.num_train_steps, c.warmup_steps = 32, 8, 6, 1",
        f"c.num_train_steps, c.warmup_steps = 32, 8, {steps}, 1",
    )
    text = text.replace("= 6, 1, 3, 6\n", f"= {steps}, 1, {every}, {every}\n")
    assert f"= {steps}, 1, {every}, {every}" in text  # the template still has these lines
    config.write_text(text)
    glue = _sst2(tmp_path / "glue", [_one_line(i) for i in range(64)], [_one_line(64)])
    study_dir = tmp_path / "study"
    args = [
        f"--study_dir={study_dir}", f"--configs={config}", "--tasks=sst2", f"--glue_dir={glue}",
        "--seeds=1", "--max_steps=2", "--rank_tokens=64",
    ]  # fmt: skip
    return args, study_dir


STAGES = ("mlm/pretrain", "mlm/export", "mlm/finetune", "mlm/rank", "random_init/finetune")


@pytest.mark.parametrize("cluster", ["slurm", "ompi", "tpu_vm", "job_of_one"])
def test_a_cluster_of_one_process_runs_the_study_to_its_table(tmp_path, monkeypatch, cluster):
    """Each ran, pretrained, then stopped at the accelerator handover ("handed over only
    after the job's shutdown"), and every rerun failed the same way: a job of one process
    was joined and never left."""
    args, study_dir = _micro_study(tmp_path, steps=4, every=4)
    env, command = {}, None
    if cluster == "slurm":
        env = SLURM_OF_ONE
    elif cluster == "ompi":
        env = OMPI_OF_ONE
    elif cluster == "tpu_vm":
        command = [sys.executable, "-c", FAKE_TPU_VM]
    else:  # the coordinator flags, as a launcher of N processes writes them for N = 1
        args += [f"--coordinator_address=localhost:{free_port()}", "--num_processes=1"]
        args += ["--process_id=0"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    rc, out, err = _study(args, command=command)
    assert rc == 0, err[-3000:]
    assert "| random_init |" in out and (study_dir / "results.json").is_file()
    assert "JAX released its ['cpu'] devices" in err, err[-3000:]
    if cluster != "job_of_one":
        assert "a job of one process; it runs as a lone process" in err, err[-3000:]

    rc, out, err = _study(args, command=command)
    assert rc == 0, err[-3000:]
    for stage in STAGES:
        assert f"study: {stage} already done" in err, (stage, err[-3000:])
    assert not re.search(r"study: \S+ starting", err), err[-3000:]


def test_a_cluster_of_two_processes_is_still_joined(monkeypatch):
    for name, value in {**SLURM_OF_ONE, "SLURM_NTASKS": "2"}.items():
        monkeypatch.setenv(name, value)
    assert distributed.detected_cluster("auto") == "slurm"
    assert distributed.detected_cluster("slurm") == "slurm"
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed.detected_cluster("auto") is None
    assert distributed.detected_cluster("slurm") is None


def test_sigterm_during_pretraining_stops_the_study_there_and_the_rerun_finishes(tmp_path):
    """A preempted pod sends SIGTERM and waits a grace period. The study used to take the
    saved, stopped pretraining for a finished one: it wrote the marker with the planned
    steps, went on to the next stage, and exported the step-1 checkpoint as the row."""
    steps = 400
    args, study_dir = _micro_study(tmp_path, steps=steps, every=20)
    workdir = study_dir / "mlm" / "workdir"
    proc = _study(args, wait=False)
    first = rh.wait_for_checkpoint(proc, workdir)
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=120)  # the grace period: it must stop in it
    except Exception:
        proc.kill()
        raise
    assert proc.returncode == preemption.EXIT_PREEMPTED, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("maelm_jax.study: error: preempted during mlm's pretraining"), last
    stopped = max(rh.committed_steps(workdir))
    assert first <= stopped < steps
    assert f"saved step {stopped} of {steps}" in last, last
    assert not (study_dir / "mlm" / "pretrain.json").exists()
    assert not (study_dir / "mlm" / "export").exists()  # no later stage started
    assert not (study_dir / "random_init").exists()
    assert "| random_init |" not in out

    rc, out, err = _study(args)
    assert rc == 0, err[-3000:]
    assert f"Training mlm for steps {stopped}..{steps}" in err, err[-3000:]
    marker = json.loads((study_dir / "mlm" / "pretrain.json").read_text())
    assert marker["steps"] == steps == max(rh.committed_steps(workdir))
    assert marker["tokens"] == steps * 8 * 32
    card = (study_dir / "mlm" / "export" / "README.md").read_text()
    assert f"step {steps}" in card  # the export is of the last step, not the preempted one
