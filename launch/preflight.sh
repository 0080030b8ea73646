#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Checks on this machine (CPU; libtpu's compile-only devices, no TPU) that a config compiles
# and fits in HBM on the TPU type; create.sh and watch.sh run it before creating anything.
#
#   launch/preflight.sh --config=configs/mae_lm_large.py --accelerator_type=v5p-64
#       [--num_slices=1] [--hbm_bytes=B] [--compile_json=FILE] [--dry-run] [-- --config.key=value ...]
#
# Exit status: 0 fits, 1 does not fit, 2 bad arguments or the compile failed.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "config accelerator_type num_slices hbm_bytes compile_json" "" "$@"
require config accelerator_type
preflight
echo "preflight: $opt_config fits on ${opt_num_slices:-1} x $opt_accelerator_type" >&2
