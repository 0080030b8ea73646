#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Keeps a queued resource training until the run finishes: every --poll_s it reads the
# resource's state; ACTIVE with no trainer on worker 0: train.sh's command (it resumes);
# SUSPENDED or FAILED (preempted): delete it, create it again, set up and train (resume).
# Exits 0 when worker 0's trainer has finished with status 0. Takes create.sh's, setup.sh's
# and train.sh's flags (the preflight runs once, at the start).
#
#   launch/watch.sh --name=NAME --zone=ZONE --accelerator_type=v5p-64
#       --config=configs/mae_lm_large.py --workdir=gs://BUCKET/RUN [--mode=spot]
#       [--num_slices=N] [--runtime_version=V] [--revision=REV --repo_url=URL]
#       [--poll_s=300] [--project=P] [--hbm_bytes=B] [--compile_json=FILE] [--dry-run] [-- --config.key=value]
#
# Under --dry-run it prints one pass of each branch.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project accelerator_type config workdir mode num_slices runtime_version revision repo_url poll_s hbm_bytes compile_json" \
  "" "$@"
require name zone accelerator_type config workdir
# shellcheck disable=SC2034  # read by create_tpu and delete_tpu (lib.sh)
opt_queued=1
preflight

recreate() {
  delete_tpu
  create_tpu
  setup_workers
  start_training
}

# STEP in a subshell with errexit on: a failed step ends that attempt, not the watch.
attempt() {
  local status
  set +e
  (
    set -e
    "$@"
  )
  status=$?
  set -e
  ((status == 0)) || echo "watch.sh: $1 failed (exit $status); retrying next pass" >&2
}

if ((DRY_RUN)); then
  echo "# each pass:" >&3
  queued_state >/dev/null
  echo "# ACTIVE: is worker 0's trainer running (0), finished (3), or not (else: start, resume)" >&3
  on_workers 0 "$REMOTE_WORKER status"
  start_training
  echo "# SUSPENDED or FAILED (preempted): recreate, set up, resume" >&3
  recreate
  exit 0
fi

while :; do
  state=$(queued_state) || state=""  # gcloud failed: try again next pass
  case $state in
    ACTIVE)
      status=0
      on_workers 0 "$REMOTE_WORKER status" || status=$?
      case $status in
        0) ;;
        3)
          echo "watch.sh: training finished" >&2
          exit 0
          ;;
        *) attempt start_training ;;
      esac
      ;;
    SUSPENDED | FAILED)
      echo "watch.sh: $opt_name is $state (preempted?): recreating" >&2
      attempt recreate
      ;;
    *) echo "watch.sh: $opt_name is ${state:-unknown}; waiting" >&2 ;;
  esac
  sleep "${opt_poll_s:-300}"
done
