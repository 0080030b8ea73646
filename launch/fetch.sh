#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Copies every worker's current log to the workdir, then the logs, metrics.jsonl and the
# TensorBoard events from the workdir to a local directory.
#
#   launch/fetch.sh --name=NAME --zone=ZONE --workdir=gs://BUCKET/RUN [--dest=DIR]
#       [--num_slices=N] [--project=P] [--dry-run]
#
# DEST defaults to fetched/NAME.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project workdir dest num_slices" "" "$@"
require name zone workdir
dest=${opt_dest:-fetched/$opt_name}
on_workers all "$REMOTE_WORKER copy_log"
run mkdir -p "$dest"
run gcloud storage cp -r "$opt_workdir/logs" "$opt_workdir/metrics.jsonl" "$dest/"
run gcloud storage rsync -r -x '^(checkpoints|data_cache)/' "$opt_workdir" "$dest/workdir"
