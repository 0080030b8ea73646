#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Opens TensorBoard (scalars, and XProf traces in the Profile tab with the profile extra,
# `pip install -e ".[profile]"`, i.e. xprof) on the workdir, from this machine.
#
#   launch/tensorboard.sh --workdir=gs://BUCKET/RUN [--port=6006] [--dry-run]
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "workdir port" "" "$@"
require workdir
run tensorboard "--logdir=$opt_workdir" "--port=${opt_port:-6006}"
