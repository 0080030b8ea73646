#!/usr/bin/env bash
# Run maelm_jax on every host of a Cloud TPU VM slice (one command per host, as JAX expects).
#
#   launch/tpu_vm.sh setup  TPU_NAME ZONE             # copy this repo to all hosts, install
#   launch/tpu_vm.sh train  TPU_NAME ZONE CONFIG WORKDIR [--config.key=value ...]
#   launch/tpu_vm.sh stop   TPU_NAME ZONE             # SIGTERM: checkpoint, then exit
#
# WORKDIR must be storage every host sees (gs://...). Training runs under nohup and logs to
# ~/maelm_jax.log on each host; rerunning `train` resumes from the newest checkpoint.
set -euo pipefail

usage() { sed -n '2,10p' "$0" >&2; exit 2; }
[[ $# -ge 3 ]] || usage
action=$1 tpu=$2 zone=$3
shift 3
repo=$(cd "$(dirname "$0")/.." && pwd)
on_all() { gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="$1"; }

case "$action" in
  setup)
    tar -C "$repo" --exclude=.venv --exclude=.git --exclude=workdirs -czf /tmp/maelm_jax.tgz .
    gcloud compute tpus tpu-vm scp /tmp/maelm_jax.tgz "$tpu":~/ --zone="$zone" --worker=all
    on_all 'mkdir -p ~/maelm_jax && tar -C ~/maelm_jax -xzf ~/maelm_jax.tgz &&
      python3 -m venv ~/maelm_venv && ~/maelm_venv/bin/pip install -q -e "$HOME/maelm_jax[tpu]"'
    ;;
  train)
    [[ $# -ge 2 ]] || usage
    config=$1 workdir=$2
    shift 2
    extra=$(printf ' %q' "$@")
    on_all "cd ~/maelm_jax && nohup ~/maelm_venv/bin/python -m maelm_jax.main \
      --config=$config --workdir=$workdir$extra > ~/maelm_jax.log 2>&1 &"
    ;;
  stop)
    on_all 'pkill -TERM -f maelm_jax.main || true'
    ;;
  *) usage ;;
esac
