"""launch/: every script's --dry-run commands, exactly; --help, bash -n and shellcheck; the
preflight refusing a config that does not fit (a real compile); stop signalling only the
recorded PID."""

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from tiny_configs import REPO_ROOT

LAUNCH = REPO_ROOT / "launch"
SCRIPTS = sorted(p.name for p in LAUNCH.glob("*.sh") if p.name != "lib.sh")
WORKER = "bash ~/maelm_jax/launch/worker.sh"
SSH = "gcloud compute tpus tpu-vm ssh"


def launch(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The script as a shell runs it, its `python` this test's interpreter (first on PATH),
    as in an activated virtualenv, whether or not pytest was started from one."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path, **(env or {})},
        timeout=120,
    )


def dry_run(script: str, *args: str, **kwargs) -> list[list[str]]:
    """The commands `script ... --dry-run` prints, each split as a shell would split it."""
    split = args.index("--") if "--" in args else len(args)
    result = launch(script, *args[:split], "--dry-run", *args[split:], **kwargs)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line]


def ssh(node: str, worker: str, command: str, zone: str = "us-east5-a") -> list[str]:
    return [*SSH.split(), node, f"--zone={zone}", f"--worker={worker}", f"--command={command}"]


def test_every_script_parses_has_help_and_passes_shellcheck():
    assert {"create.sh", "delete.sh", "setup.sh", "train.sh", "watch.sh", "stop.sh"} <= set(SCRIPTS)
    for script in [*SCRIPTS, "lib.sh"]:
        subprocess.run(["bash", "-n", str(LAUNCH / script)], check=True)
    for script in SCRIPTS:
        result = launch(script, "--help")
        assert result.returncode == 0 and "--dry-run" in result.stdout, script
        assert "shellcheck" not in result.stdout
    shellcheck = shutil.which("shellcheck") or str(
        pathlib.Path(sys.executable).with_name("shellcheck")
    )
    result = subprocess.run(
        [shellcheck, "-x", *sorted(str(p) for p in LAUNCH.glob("**/*.sh"))],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert result.returncode == 0, result.stdout


def test_bad_flags_get_one_line_and_status_2():
    result = launch("train.sh", "--name=a", "--zone=z", "--bogus=1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "train.sh: error: unknown flag --bogus; allowed: --name --zone --project --workdir "
        "--config --num_slices (--help)"
    ]
    result = launch("train.sh", "--name=a", "--zone=z", "--workdir=/tmp/run", "--config=c")
    assert result.returncode == 2 and "use gs://BUCKET/PATH" in result.stderr
    result = launch("create.sh", "--name=a", "--zone=z", "--accelerator_type=v4-32", "--mode=cheap")
    assert result.returncode == 2 and "--skip_preflight" not in result.stderr


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--mode=on-demand"],
            "gcloud compute tpus tpu-vm create mae --zone=us-east5-a --accelerator-type=v5p-64 "
            "--version=v2-alpha-tpuv5",
        ),
        (
            ["--mode=spot", "--runtime_version=v2-custom", "--project=proj"],
            "gcloud compute tpus tpu-vm create mae --zone=us-east5-a --project=proj "
            "--accelerator-type=v5p-64 --version=v2-custom --spot",
        ),
        (
            ["--mode=reserved", "--queued"],
            "gcloud compute tpus queued-resources create mae --zone=us-east5-a "
            "--accelerator-type=v5p-64 --runtime-version=v2-alpha-tpuv5 --node-id=mae --reserved",
        ),
        (
            ["--mode=spot", "--queued", "--num_slices=2"],
            "gcloud compute tpus queued-resources create mae --zone=us-east5-a "
            "--accelerator-type=v5p-64 --runtime-version=v2-alpha-tpuv5 --node-count=2 "
            "--node-prefix=mae --spot",
        ),
    ],
)
def test_create(extra, expected):
    commands = dry_run(
        "create.sh",
        "--name=mae",
        "--zone=us-east5-a",
        "--accelerator_type=v5p-64",
        "--skip_preflight",
        *extra,
    )
    assert commands[0] == shlex.split(expected)
    if "--queued" in extra:  # then it waits for ACTIVE
        zone = ["--zone=us-east5-a"]
        assert commands[1:] == [
            shlex.split("gcloud compute tpus queued-resources describe mae")
            + zone
            + ["--format=value(state.state)"]
        ]
    else:
        assert len(commands) == 1


def test_multislice_needs_a_queued_resource():
    result = launch(
        "create.sh", "--name=a", "--zone=z", "--accelerator_type=v4-32", "--num_slices=2",
        "--skip_preflight", "--dry-run",
    )  # fmt: skip
    assert result.returncode == 2 and "needs --queued" in result.stderr and not result.stdout


def test_delete():
    assert dry_run("delete.sh", "--name=mae", "--zone=z") == [
        shlex.split("gcloud compute tpus tpu-vm delete mae --zone=z --quiet")
    ]
    assert dry_run("delete.sh", "--name=mae", "--zone=z", "--queued") == [
        shlex.split("gcloud compute tpus queued-resources delete mae --zone=z --force --quiet")
    ]


def test_setup_copies_the_tree_installs_the_tpu_extra_and_checks_the_device_count():
    commands = dry_run("setup.sh", "--name=mae", "--zone=us-east5-a", "--accelerator_type=v5p-64")
    tarball = "/tmp/maelm_jax-mae.tgz"
    assert commands == [
        ["tar", "-C", str(REPO_ROOT), "--exclude=.git", "--exclude=.venv", "--exclude=workdirs",
         "-czf", tarball, "."],
        [*SSH.replace("ssh", "scp").split(), tarball, "mae:maelm_jax.tgz", "--zone=us-east5-a",
         "--worker=all"],
        ssh("mae", "all", "rm -rf ~/maelm_jax && mkdir ~/maelm_jax && tar -C ~/maelm_jax -xzf "
            "~/maelm_jax.tgz"),
        ssh("mae", "all", f"{WORKER} install"),
        ssh("mae", "all", f"{WORKER} check --expect_devices=32"),  # v5p-64: 32 chips
    ]  # fmt: skip
    # What `install` runs on each worker: the project with the tpu extra, into a venv.
    assert dry_run("worker.sh", "install", env={"MAELM_HOME": "/h"})[-1] == [
        "/h/maelm_venv/bin/pip", "install", "-q", "-e", "/h/maelm_jax[tpu]"
    ]  # fmt: skip


def test_setup_at_a_revision_on_every_slice():
    commands = dry_run(
        "setup.sh", "--name=m", "--zone=z", "--accelerator_type=v4-32", "--num_slices=2",
        "--revision=abc123", "--repo_url=https://example.com/maelm_jax.git",
    )  # fmt: skip
    clone = (
        "set -e; [ -d ~/maelm_jax/.git ] || git clone --quiet https://example.com/maelm_jax.git "
        "~/maelm_jax; git -C ~/maelm_jax fetch --quiet origin; git -C ~/maelm_jax checkout "
        "--quiet --detach abc123"
    )
    steps = [clone, f"{WORKER} install", f"{WORKER} check --expect_devices=32"]  # 2 x 16 chips
    assert commands == [ssh(n, "all", s, zone="z") for s in steps for n in ("m-0", "m-1")]


def test_train_on_all_workers_and_a_rerun_is_the_same_resuming_command():
    args = ["--name=mae", "--zone=us-east5-a", "--workdir=gs://bucket/run 1",
            "--config=configs/mae_lm_large.py", "--", "--config.num_train_steps=1000"]  # fmt: skip
    start = (
        f"{WORKER} start '--workdir=gs://bucket/run 1' --config=configs/mae_lm_large.py -- "
        "--config.num_train_steps=1000"
    )
    assert dry_run("train.sh", *args) == [ssh("mae", "all", start)]
    assert dry_run("train.sh", *args) == dry_run("train.sh", *args)
    # On the worker: main in the venv, the gs:// workdir, the profiler server for profile.sh.
    on_worker = dry_run(
        "worker.sh", "start", "--workdir=gs://b/r", "--config=c.py", "--", "--config.x=1",
        env={"MAELM_HOME": "/h"},
    )  # fmt: skip
    assert on_worker == [
        ["/h/maelm_venv/bin/python", "-m", "maelm_jax.main", "--config=c.py",
         "--workdir=gs://b/r", "--profiler_port=9999", "--config.x=1"]
    ]  # fmt: skip


def test_stop_fetch_profile_tensorboard():
    zone = "--zone=z"
    assert dry_run("stop.sh", "--name=a", zone, "--num_slices=2") == [
        ssh("a-0", "all", f"{WORKER} stop --timeout_s=900", zone="z"),
        ssh("a-1", "all", f"{WORKER} stop --timeout_s=900", zone="z"),
    ]
    assert dry_run("fetch.sh", "--name=a", zone, "--workdir=gs://b/r") == [
        ssh("a", "all", f"{WORKER} copy_log", zone="z"),
        ["mkdir", "-p", "fetched/a"],
        shlex.split("gcloud storage cp -r gs://b/r/logs gs://b/r/metrics.jsonl fetched/a/"),
        ["gcloud", "storage", "rsync", "-r", "-x", "^(checkpoints|data_cache)/", "gs://b/r",
         "fetched/a/workdir"],
    ]  # fmt: skip
    assert dry_run("profile.sh", "--name=a", zone, "--workdir=gs://b/r") == [
        ssh("a", "all", f"{WORKER} profile --logdir=gs://b/r --duration_ms=3000", zone="z")
    ]
    assert dry_run("tensorboard.sh", "--workdir=gs://b/r") == [
        ["tensorboard", "--logdir=gs://b/r", "--port=6006"]
    ]


def test_watch_recreates_a_preempted_slice_and_resumes(tmp_path):
    fits = tmp_path / "fits.json"
    fits.write_text(
        '{"topology": "v5p-64", "num_slices": 1, "mesh_shape": {"fsdp": 32}, "batch_size": 2048,'
        ' "seq_len": 512, "memory": {}, "memory_per_chip_bytes": 1, "hbm_per_chip_bytes": 2,'
        ' "fits": true}'
    )
    result = launch(
        "watch.sh", "--name=mae", "--zone=z", "--accelerator_type=v5p-64", "--mode=spot",
        "--config=configs/mae_lm_large.py", "--workdir=gs://b/r", f"--compile_json={fits}",
        "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    describe = [
        *shlex.split("gcloud compute tpus queued-resources describe mae --zone=z"),
        "--format=value(state.state)",
    ]
    start = ssh(
        "mae",
        "all",
        f"{WORKER} start --workdir=gs://b/r --config=configs/mae_lm_large.py",
        zone="z",
    )
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# each pass:",
        "# ACTIVE: is worker 0's trainer running (0), finished (3), or not (else: start, resume)",
        "# SUSPENDED or FAILED (preempted): recreate, set up, resume",
    ]
    commands = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert commands[:3] == [describe, ssh("mae", "0", f"{WORKER} status", zone="z"), start]
    assert commands[3:6] == [
        shlex.split("gcloud compute tpus queued-resources delete mae --zone=z --force --quiet"),
        shlex.split(
            "gcloud compute tpus queued-resources create mae --zone=z --accelerator-type=v5p-64 "
            "--runtime-version=v2-alpha-tpuv5 --node-id=mae --spot"
        ),
        describe,
    ]
    assert commands[-2] == ssh("mae", "all", f"{WORKER} check --expect_devices=32", zone="z")
    assert commands[-1] == start  # the same command: it resumes


def test_preflight_refuses_a_config_that_does_not_fit(tmp_path):
    """A real compile of the tiny config for a v4-8, judged against 64 KiB of HBM per chip."""
    config = tmp_path / "tiny.py"
    config.write_text(
        "from tests.tiny_configs import tiny_config\n\n\n"
        "def get_config():\n"
        "    c = tiny_config(seq_len=16, dropout_rate=0.0, attention_dropout_rate=0.0)\n"
        "    c.batch_size = 4\n"
        "    return c\n"
    )
    result = launch(
        "create.sh", "--name=t", "--zone=z", "--accelerator_type=v4-8", f"--config={config}",
        "--hbm_bytes=65536", "--dry-run",
        env={"PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"python -m maelm_jax.compile --config={config} --topology=v4-8 --num_slices=1 "
        "--flops=skip --step_time=skip --json --hbm_bytes=65536"
    ]  # the compile ran; no gcloud command was printed
    assert "DOES NOT FIT" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"create.sh: preflight: {config} does not fit on 1 x v4-8; refusing to create anything"
    )


def test_stop_signals_the_recorded_pid_only(tmp_path):
    """Two identical processes; the one whose PID worker.sh recorded gets SIGTERM."""
    (tmp_path / "maelm_run").mkdir()
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "time.sleep(60)"
    )
    recorded, other = (subprocess.Popen([sys.executable, "-c", code]) for _ in range(2))
    try:
        time.sleep(0.3)
        (tmp_path / "maelm_run" / "pid").write_text(f"{recorded.pid}\n")
        env = {"MAELM_HOME": str(tmp_path)}
        status = launch("worker.sh", "status", env=env)
        assert status.returncode == 0 and f"running (pid {recorded.pid})" in status.stdout
        assert launch("worker.sh", "stop", "--timeout_s=20", env=env).returncode == 0
        assert recorded.wait(timeout=5) == 7  # its handler ran: it was a SIGTERM
        assert other.poll() is None
        assert launch("worker.sh", "status", env=env).returncode == 1
    finally:
        for p in (recorded, other):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def test_worker_start_records_the_trainer_and_copies_its_log(tmp_path):
    """A real `worker.sh start` of main with a bad value: the trainer's own PID is recorded,
    its exit status is kept, and its log reaches WORKDIR/logs/<host>.log."""
    home, workdir = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (home / "maelm_venv").symlink_to(sys.prefix)  # this test's venv stands in for the host's
    (home / "maelm_jax").symlink_to(REPO_ROOT)
    env = {"MAELM_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    args = ["start", f"--workdir={workdir}", "--config=configs/default.py", "--"]
    started = launch("worker.sh", *args, "--config.batch_size=0", env=env)
    assert started.returncode == 0, started.stderr
    pid = int((home / "maelm_run" / "pid").read_text())
    assert f"training started (pid {pid})" in started.stdout
    exit_file = home / "maelm_run" / "exit"
    deadline = time.monotonic() + 120
    while not (exit_file.exists() and (workdir / "logs").is_dir()):
        assert time.monotonic() < deadline, "the trainer did not finish"
        time.sleep(0.5)
    assert exit_file.read_text().strip() == "1"  # main's exit status for bad input
    [log] = (workdir / "logs").iterdir()
    assert "maelm_jax: error: batch_size=0 is not allowed" in log.read_text()
    assert launch("worker.sh", "status", env=env).returncode == 1  # not running, not finished


def test_the_gpu_bench_refuses_an_unknown_part_before_it_runs_anything(tmp_path):
    result = subprocess.run(
        ["bash", str(LAUNCH / "gpu" / "bench.sh"), str(tmp_path / "out"), "-", "tests,kernals"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "unknown part 'kernals': use a comma-separated list of "
        "tests,relative,pair,roberta,xla_dropout,roberta_peer,modern_peer,compiled_peers,modern,"
        "modern_pair,modern32,before,variants,mae_variants,bias,kernels"
    ]
    assert not (tmp_path / "out").exists()
