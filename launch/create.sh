#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Creates a TPU VM, or with --queued a queued resource (waiting until it is ACTIVE), after a
# preflight compile of the config for that TPU type: nothing is created if it does not fit.
#
#   launch/create.sh --name=NAME --zone=ZONE --accelerator_type=v5p-64
#       --config=configs/mae_lm_large.py [--mode=on-demand|spot|reserved] [--queued]
#       [--num_slices=N (multislice; needs --queued)] [--runtime_version=V]
#       [--project=P] [--hbm_bytes=B] [--compile_json=FILE] [--skip_preflight] [--dry-run] [-- --config.key=value]
#
# The runtime version defaults by type: v4 tpu-ubuntu2204-base, v5p v2-alpha-tpuv5,
# v5e v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project accelerator_type config mode num_slices runtime_version hbm_bytes compile_json" \
  "queued skip_preflight" "$@"
require name zone accelerator_type
if [[ -z ${opt_skip_preflight:-} ]]; then
  require config
  preflight
fi
create_tpu
