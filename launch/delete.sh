#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Deletes the TPU VM, or with --queued the queued resource and all its slices.
#
#   launch/delete.sh --name=NAME --zone=ZONE [--queued] [--project=P] [--dry-run]
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project" "queued" "$@"
require name zone
delete_tpu
