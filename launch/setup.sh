#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Puts the project on every worker of every slice, at a git revision or as this working
# tree, installs it with the tpu extra into ~/maelm_venv, and checks on all workers at once
# that jax.device_count() is the topology's (printed per worker).
#
#   launch/setup.sh --name=NAME --zone=ZONE --accelerator_type=v5p-64 [--num_slices=N]
#       [--revision=REV --repo_url=URL] [--project=P] [--dry-run]
#
# Without --revision the working tree (uncommitted changes included) is copied.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project accelerator_type num_slices revision repo_url" "" "$@"
require name zone accelerator_type
setup_workers
