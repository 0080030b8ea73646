#!/usr/bin/env bash
# Run N maelm_jax processes on this machine, as a pod would run one per host: each gets
# DEVICES simulated CPU devices and they talk through jax.distributed with gloo.
#
#   launch/local_processes.sh N DEVICES CONFIG WORKDIR [--config.key=value ...]
#
# Logs go to WORKDIR/process_<i>.log; the exit status is the first non-zero one.
set -euo pipefail
[[ $# -ge 4 ]] || { sed -n '2,8p' "$0" >&2; exit 2; }
n=$1 devices=$2 config=$3 workdir=$4
shift 4
mkdir -p "$workdir"
port=$((20000 + RANDOM % 20000))
pids=()
for ((i = 0; i < n; i++)); do
  JAX_PLATFORMS=cpu XLA_FLAGS="--xla_force_host_platform_device_count=$devices" \
    python -m maelm_jax.main --config="$config" --workdir="$workdir" \
    --coordinator_address="localhost:$port" --num_processes="$n" --process_id="$i" "$@" \
    > "$workdir/process_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { rc=$?; [[ $status -ne 0 ]] || status=$rc; }
done
exit "$status"
