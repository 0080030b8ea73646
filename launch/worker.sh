#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Runs ON each TPU VM worker (the other scripts call it over ssh); one training process per
# worker, whose PID is recorded, so stopping it never matches processes by name.
#
#   worker.sh install                           venv ~/maelm_venv with the project's tpu extra
#   worker.sh check --expect_devices=N          jax.device_count() must be N (all workers at once)
#   worker.sh start --workdir=gs://... --config=FILE [-- --config.key=value ...]
#                                               start training unless the recorded PID runs;
#                                               a restart resumes from the newest checkpoint
#   worker.sh stop [--timeout_s=900]            SIGTERM to the recorded PID (it checkpoints), wait
#   worker.sh status                            exit 0 running, 3 finished (exit 0), 1 not running
#   worker.sh copy_log                          this worker's log to WORKDIR/logs/<hostname>.log
#   worker.sh profile --logdir=gs://... [--duration_ms=3000] [--port=9999]
#                                               an XProf trace from the trainer's profiler server
#
# Files: ~/maelm_run/{pid,workdir,exit,train.log}; MAELM_HOME replaces ~ (for tests).
# --dry-run prints the commands instead of running them; --help prints this.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

home=${MAELM_HOME:-$HOME}
venv=$home/maelm_venv
rundir=$home/maelm_run
PROFILER_PORT=9999

[[ $# -ge 1 ]] || die "give a command: install, check, start, stop, status, copy_log, profile (--help)"
action=$1
shift
case $action in
  -h | --help) usage; exit 0 ;;
esac
parse_flags "expect_devices workdir config timeout_s logdir duration_ms port" "" "$@"

alive() {
  # The process exists and is not a zombie (exited, not yet reaped by its parent).
  local stat
  stat=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $stat != Z* ]]
}

running_pid() {
  # The recorded PID, if that process still runs.
  local pid
  [[ -f $rundir/pid ]] || return 1
  pid=$(<"$rundir/pid")
  alive "$pid" || return 1
  echo "$pid"
}

copy_log() {
  local workdir
  [[ -f $rundir/workdir && -f $rundir/train.log ]] || return 0
  workdir=$(<"$rundir/workdir")
  run "$venv/bin/python" -c 'import socket, sys
from maelm_jax.config import paths
dst = paths.path(sys.argv[2]) / "logs" / (socket.gethostname() + ".log")
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_bytes(paths.path(sys.argv[1]).read_bytes())' "$rundir/train.log" "$workdir"
}

case $action in
  install)
    run python3 -m venv "$venv"
    run "$venv/bin/pip" install -q --upgrade pip
    run "$venv/bin/pip" install -q -e "$home/maelm_jax[tpu]"
    ;;
  check)
    require expect_devices
    run "$venv/bin/python" -c 'import socket, sys, jax
jax.distributed.initialize()
n, want = jax.device_count(), int(sys.argv[1])
print(f"{socket.gethostname()}: process {jax.process_index()} of {jax.process_count()}, "
      f"jax.device_count()={n} (expected {want}), local {jax.local_device_count()}", flush=True)
sys.exit(0 if n == want else 1)' "$opt_expect_devices"
    ;;
  start)
    require workdir config
    if pid=$(running_pid); then
      echo "$(hostname): training already runs (pid $pid); left alone"
      exit 0
    fi
    ((DRY_RUN)) || mkdir -p "$rundir"
    if ((!DRY_RUN)); then
      printf '%s\n' "$opt_workdir" >"$rundir/workdir"
      rm -f "$rundir/exit"
      echo "=== $(date -u +%FT%TZ) start (resumes from the newest checkpoint) ===" >>"$rundir/train.log"
    fi
    cmd=("$venv/bin/python" -m maelm_jax.main "--config=$opt_config" "--workdir=$opt_workdir"
      "--profiler_port=$PROFILER_PORT" "${PASSTHROUGH[@]}")
    if ((DRY_RUN)); then
      command_line "${cmd[@]}"
      exit 0
    fi
    cd "$home/maelm_jax"
    rm -f "$rundir/pid"
    # A wrapper that records the trainer's own PID (the one stop signals), copies the log
    # to the workdir every 5 minutes and at the end, and records the exit status.
    # shellcheck disable=SC2016  # expanded by the wrapper's bash
    RUNDIR=$rundir SELF=${BASH_SOURCE[0]} nohup bash -c '"$@" >>"$RUNDIR/train.log" 2>&1 </dev/null &
      pid=$!
      echo "$pid" >"$RUNDIR/pid"
      (n=0; while sleep 10 && kill -0 "$pid" 2>/dev/null; do
        ((++n % 30)) || bash "$SELF" copy_log || true; done) &
      wait "$pid" && status=0 || status=$?
      echo "$status" >"$RUNDIR/exit"
      bash "$SELF" copy_log || true' wrapper "${cmd[@]}" >/dev/null 2>&1 </dev/null 3>&- &
    for ((i = 0; i < 100; i++)); do
      [[ -s $rundir/pid ]] && break
      sleep 0.1
    done
    echo "$(hostname): training started (pid $(<"$rundir/pid")), log $rundir/train.log"
    ;;
  stop)
    if ! pid=$(running_pid); then
      echo "$(hostname): no training runs"
      exit 0
    fi
    run kill -TERM "$pid"
    ((DRY_RUN)) && exit 0
    for ((i = 0; i < ${opt_timeout_s:-900}; i++)); do
      alive "$pid" || break
      sleep 1
    done
    if alive "$pid"; then
      echo "$(hostname): pid $pid still runs after ${opt_timeout_s:-900}s" >&2
      exit 1
    fi
    copy_log
    echo "$(hostname): stopped pid $pid"
    ;;
  status)
    if pid=$(running_pid); then
      echo "$(hostname): running (pid $pid)"
      exit 0
    fi
    if [[ $(cat "$rundir/exit" 2>/dev/null) == 0 ]]; then
      echo "$(hostname): finished"
      exit 3
    fi
    echo "$(hostname): not running"
    exit 1
    ;;
  copy_log) copy_log ;;
  profile)
    require logdir
    run "$venv/bin/python" -c 'import sys
import tensorflow as tf
tf.profiler.experimental.client.trace(sys.argv[1], sys.argv[2], int(sys.argv[3]))' \
      "grpc://localhost:${opt_port:-$PROFILER_PORT}" "$opt_logdir" "${opt_duration_ms:-3000}"
    ;;
  *) die "unknown command '$action'; use install, check, start, stop, status, copy_log, profile" ;;
esac
