#!/usr/bin/env bash
# shellcheck disable=SC2154  # opt_<key>: set by parse_flags (lib.sh), by name
# Starts training on every worker at once (--worker=all); each worker records the trainer's
# PID and keeps its log in ~/maelm_run/train.log, copied to WORKDIR/logs/<hostname>.log.
# Safe to rerun, e.g. after a preemption: the same command resumes from the newest
# checkpoint in the workdir, and a worker whose trainer still runs is left alone.
#
#   launch/train.sh --name=NAME --zone=ZONE --workdir=gs://BUCKET/RUN
#       --config=configs/mae_lm_large.py [--num_slices=N] [--project=P] [--dry-run]
#       [-- --config.key=value ...]
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_flags "name zone project workdir config num_slices" "" "$@"
require name zone workdir config
start_training
