#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Runs N maelm_jax processes on this machine, as a pod runs one per host: each gets DEVICES
# simulated CPU devices and they talk through jax.distributed with gloo.
#
#   launch/local_processes.sh --processes=N --devices=DEVICES --config=FILE --workdir=DIR
#       [--port=P] [--dry-run] [-- --config.key=value ...]
#
# Logs go to WORKDIR/process_<i>.log; the exit status is the first non-zero one.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "processes devices config workdir port" "" "$@"
require processes devices config workdir
port=${opt_port:-$((20000 + RANDOM % 20000))}
run mkdir -p "$opt_workdir"
pids=()
for ((i = 0; i < opt_processes; i++)); do
  cmd=(env JAX_PLATFORMS=cpu "XLA_FLAGS=--xla_force_host_platform_device_count=$opt_devices"
    python -m maelm_jax.main "--config=$opt_config" "--workdir=$opt_workdir"
    "--coordinator_address=localhost:$port" "--num_processes=$opt_processes" "--process_id=$i"
    "${PASSTHROUGH[@]}")
  if ((DRY_RUN)); then
    command_line "${cmd[@]}"
    continue
  fi
  "${cmd[@]}" >"$opt_workdir/process_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { rc=$?; [[ $status -ne 0 ]] || status=$rc; }
done
exit "$status"
