#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Captures an XProf trace of a running job: every worker asks its trainer's profiler server
# (started by main's --profiler_port, which train.sh sets) for --duration_ms of trace and
# writes it under WORKDIR/plugins/profile/, where TensorBoard's Profile tab finds it.
#
#   launch/profile.sh --name=NAME --zone=ZONE --workdir=gs://BUCKET/RUN
#       [--duration_ms=3000] [--num_slices=N] [--project=P] [--dry-run]
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project workdir duration_ms num_slices" "" "$@"
require name zone workdir
on_workers all "$REMOTE_WORKER profile --logdir=$(shell_quote "$opt_workdir") --duration_ms=${opt_duration_ms:-3000}"
