#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Stops training cleanly: SIGTERM to each worker's recorded trainer PID (never a match by
# name), which saves a checkpoint and exits; waits up to --timeout_s, then copies the logs.
#
#   launch/stop.sh --name=NAME --zone=ZONE [--num_slices=N] [--timeout_s=900] [--project=P]
#       [--dry-run]
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project num_slices timeout_s" "" "$@"
require name zone
on_workers all "$REMOTE_WORKER stop --timeout_s=${opt_timeout_s:-900}"
