# shellcheck shell=bash disable=SC2154
# (SC2154: the opt_<key> variables are set by parse_flags, by name.)
# Shared by the launch/ scripts (sourced, never run): flag parsing, the dry-run runner and
# the naming of TPU nodes. Each script documents its flags in its header comment, which
# `--help` prints.
#
# Flags are `--key=value` (or `--key` for booleans); `--dry-run` prints every command that
# would change or query something (gcloud, ssh, scp, tar, tensorboard) on stdout, one per
# line, arguments quoted as a shell would need them, and runs none of them. Everything
# after `--` is passed on to `python -m maelm_jax.main` (or compile), e.g. --config.x=y.

DRY_RUN=0
PASSTHROUGH=()
# The dry-run listing goes to fd 3, the script's stdout, also from inside $(...).
exec 3>&1
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(dirname "$LAUNCH_DIR")
# Where a worker keeps the project, its venv and the run's pid and log (worker.sh).
REMOTE_WORKER="bash ~/maelm_jax/launch/worker.sh"

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 2
}

usage() {
  # The header comment: from line 2 to the first line that is not a comment.
  awk 'NR > 1 && !/^#/ { exit } NR > 1 && !/^# shellcheck/ { sub(/^# ?/, ""); print }' "$0"
}

# parse_flags "allowed keys" "boolean keys" "$@": sets opt_<key> for each --key=value (dashes
# in keys become underscores) and opt_<key>=1 for each boolean --key.
parse_flags() {
  local allowed=" $1 " booleans=" $2 " key value
  shift 2
  while (($#)); do
    case $1 in
      -h | --help)
        usage
        exit 0
        ;;
      --dry-run | --dry_run) DRY_RUN=1 ;;
      --)
        shift
        PASSTHROUGH=("$@")
        return
        ;;
      --*=*)
        key=${1%%=*}
        key=${key#--}
        key=${key//-/_}
        value=${1#*=}
        [[ $allowed == *" $key "* ]] || die "unknown flag --$key; allowed:$(flag_list "$allowed") (--help)"
        printf -v "opt_$key" '%s' "$value"
        ;;
      --*)
        key=${1#--}
        key=${key//-/_}
        [[ $booleans == *" $key "* ]] || die "unknown flag --$key, or it needs =VALUE; allowed:$(flag_list "$allowed") (--help)"
        printf -v "opt_$key" '%s' 1
        ;;
      *) die "unexpected argument '$1'; flags are --key=value, and main's flags go after --" ;;
    esac
    shift
  done
}

flag_list() {
  local k out=""
  for k in $1; do out+=" --$k"; done
  echo "$out"
}

# require KEY...: every flag given and non-empty.
require() {
  local key var
  for key; do
    var="opt_$key"
    [[ -n ${!var:-} ]] || die "--$key=... is required (--help)"
  done
}

# A word as a shell would need it quoted: bare when safe, else in single quotes.
shell_quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,~-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# The command as one line, e.g. for --dry-run.
command_line() {
  local word line=""
  for word; do line+="${line:+ }$(shell_quote "$word")"; done
  printf '%s\n' "$line"
}

# run CMD ARGS...: prints it under --dry-run, else runs it.
run() {
  if ((DRY_RUN)); then
    command_line "$@" >&3
  else
    "$@"
  fi
}

# --- TPU naming ---

# The gcloud flags every TPU command shares.
tpu_flags() {
  TPU_FLAGS=("--zone=$opt_zone")
  if [[ -n ${opt_project:-} ]]; then TPU_FLAGS+=("--project=$opt_project"); fi
}

# The TPU VM node names: NAME for one slice; NAME-0 ... NAME-(N-1) for a multislice queued
# resource (gcloud names them from --node-prefix).
node_names() {
  local n=${opt_num_slices:-1} i
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "--num_slices=$n is not allowed; it must be >= 1"
  if ((n == 1)); then
    NODES=("$opt_name")
  else
    NODES=()
    for ((i = 0; i < n; i++)); do NODES+=("$opt_name-$i"); done
  fi
}

# on_workers WORKER COMMAND: the remote command on that worker (all, or an index) of every
# node, all nodes at once (a multislice job starts on every slice together).
on_workers() {
  local worker=$1 command=$2 node pids=() status=0 pid
  tpu_flags
  node_names
  for node in "${NODES[@]}"; do
    if ((DRY_RUN || ${#NODES[@]} == 1)); then
      run gcloud compute tpus tpu-vm ssh "$node" "${TPU_FLAGS[@]}" "--worker=$worker" \
        "--command=$command" || status=$?
    else
      gcloud compute tpus tpu-vm ssh "$node" "${TPU_FLAGS[@]}" "--worker=$worker" \
        "--command=$command" &
      pids+=($!)
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return "$status"
}

# scp_to_workers LOCAL REMOTE: a local file to every worker of every node.
scp_to_workers() {
  local node
  tpu_flags
  node_names
  for node in "${NODES[@]}"; do
    run gcloud compute tpus tpu-vm scp "$1" "$node:$2" "${TPU_FLAGS[@]}" --worker=all
  done
}

# Chips (= JAX devices on v4/v5p/v5e/v6e) in one slice of an accelerator type: v4-32 and
# v5p-64 count TensorCores (two per chip); v5litepod-16, v5e-16 and v6e-64 count chips.
devices_per_slice() {
  local type=$1 n=${1##*-}
  [[ $n =~ ^[0-9]+$ ]] || die "--accelerator_type=$type is not allowed; use e.g. v5p-64, v4-32, v5litepod-16, v6e-64"
  case $type in
    v4-* | v5p-*) echo $((n / 2)) ;;
    v5litepod-* | v5e-* | v6e-*) echo "$n" ;;
    *) die "--accelerator_type=$type is not allowed; use e.g. v5p-64, v4-32, v5litepod-16, v6e-64" ;;
  esac
}

# The TPU software image for an accelerator type, unless --runtime_version names one.
default_runtime_version() {
  case $1 in
    v4-*) echo tpu-ubuntu2204-base ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) die "no default runtime for --accelerator_type=$1; give --runtime_version" ;;
  esac
}

# --- The steps, shared by the scripts named after them and by watch.sh ---

# Compiles the config for the topology here, on this machine's CPU (libtpu, no TPU), and
# stops the script unless it fits (memory only: no FLOP count, no step-time estimate):
# nothing is created for a config that cannot run. Runs
# under --dry-run too (it is local and free). --compile_json=FILE takes the --json output of
# an earlier `python -m maelm_jax.compile` for the same topology instead of compiling again.
preflight() {
  local n=${opt_num_slices:-1} status=0 report
  if [[ -n ${opt_compile_json:-} ]]; then
    report=$opt_compile_json
    [[ -f $report ]] || die "--compile_json=$report: no such file"
  else
    report=$(mktemp)
    local cmd=(python -m maelm_jax.compile "--config=$opt_config" "--topology=$opt_accelerator_type"
      "--num_slices=$n" --flops=skip --step_time=skip --json)
    if [[ -n ${opt_hbm_bytes:-} ]]; then cmd+=("--hbm_bytes=$opt_hbm_bytes"); fi
    cmd+=("${PASSTHROUGH[@]}")
    if ((DRY_RUN)); then command_line "${cmd[@]}" >&3; fi
    PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}" >"$report" 2>"$report.err" || status=$?
  fi
  # 0: fits; 1: the report says it does not; 2: no report (the compile's error is shown).
  python3 - "$report" "$opt_accelerator_type" "$n" >&2 <<'PY' || status=$?
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(2)
if (r["topology"], r["num_slices"]) != (sys.argv[2], int(sys.argv[3])):
    print(f"preflight: the report is for {r['num_slices']} x {r['topology']}, not "
          f"{sys.argv[3]} x {sys.argv[2]}")
    sys.exit(2)
need, hbm = r["memory_per_chip_bytes"], r["hbm_per_chip_bytes"]
need_s = "?" if need is None else f"{'>= ' if r['memory'] is None else ''}{need / 2**30:.2f} GiB"
print(f"preflight: {r['num_slices']} x {r['topology']}, mesh {r['mesh_shape']}, batch "
      f"{r['batch_size']} x {r['seq_len']}: {need_s} per chip of {hbm / 2**30:.2f} GiB HBM: "
      + ("fits" if r["fits"] else "DOES NOT FIT"))
sys.exit(0 if r["fits"] else 1)
PY
  case $status in
    0) ;;
    1)
      echo "$(basename "$0"): preflight: $opt_config does not fit on $n x $opt_accelerator_type; refusing to create anything" >&2
      exit 1
      ;;
    *)
      if [[ -f $report.err ]]; then tail -n 5 "$report.err" >&2; fi
      echo "$(basename "$0"): preflight: could not judge $opt_config on $n x $opt_accelerator_type; refusing to create anything" >&2
      exit 2
      ;;
  esac
}

# The capacity flag of --mode: on-demand (none), spot or reserved.
mode_flags() {
  case ${opt_mode:-on-demand} in
    on-demand) MODE_FLAGS=() ;;
    spot) MODE_FLAGS=(--spot) ;;
    reserved) MODE_FLAGS=(--reserved) ;;
    *) die "--mode=$opt_mode is not allowed; use on-demand, spot or reserved" ;;
  esac
}

create_tpu() {
  local runtime=${opt_runtime_version:-} n=${opt_num_slices:-1}
  [[ -n $runtime ]] || runtime=$(default_runtime_version "$opt_accelerator_type")
  tpu_flags
  mode_flags
  node_names
  if [[ -z ${opt_queued:-} ]]; then
    ((n == 1)) || die "--num_slices=$n needs --queued: multislice runs on a queued resource"
    run gcloud compute tpus tpu-vm create "$opt_name" "${TPU_FLAGS[@]}" \
      "--accelerator-type=$opt_accelerator_type" "--version=$runtime" "${MODE_FLAGS[@]}"
    return
  fi
  local nodes=("--node-id=$opt_name")
  if ((n > 1)); then nodes=("--node-count=$n" "--node-prefix=$opt_name"); fi
  run gcloud compute tpus queued-resources create "$opt_name" "${TPU_FLAGS[@]}" \
    "--accelerator-type=$opt_accelerator_type" "--runtime-version=$runtime" "${nodes[@]}" \
    "${MODE_FLAGS[@]}"
  wait_active
}

delete_tpu() {
  tpu_flags
  if [[ -n ${opt_queued:-} ]]; then
    run gcloud compute tpus queued-resources delete "$opt_name" "${TPU_FLAGS[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$opt_name" "${TPU_FLAGS[@]}" --quiet
  fi
}

# The queued resource's state: ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE,
# SUSPENDING, SUSPENDED (preempted), FAILED, ... ("DRY_RUN" under --dry-run).
queued_state() {
  tpu_flags
  if ((DRY_RUN)); then
    command_line gcloud compute tpus queued-resources describe "$opt_name" "${TPU_FLAGS[@]}" \
      '--format=value(state.state)' >&3
    echo DRY_RUN
    return
  fi
  gcloud compute tpus queued-resources describe "$opt_name" "${TPU_FLAGS[@]}" \
    '--format=value(state.state)'
}

wait_active() {
  local state
  while :; do
    state=$(queued_state)
    case $state in
      ACTIVE | DRY_RUN) return ;;
      FAILED | SUSPENDED) die "queued resource $opt_name is $state" ;;
    esac
    echo "$(basename "$0"): $opt_name is $state; waiting" >&2
    sleep "${opt_poll_s:-60}"
  done
}

# The project on every worker: --revision of --repo_url, or this working tree; installed
# with the tpu extra into ~/maelm_venv; then jax.device_count() checked on every worker.
setup_workers() {
  local per_slice
  per_slice=$(devices_per_slice "$opt_accelerator_type")
  if [[ -n ${opt_revision:-} ]]; then
    require repo_url
    on_workers all "set -e; [ -d ~/maelm_jax/.git ] || git clone --quiet $(shell_quote "$opt_repo_url") ~/maelm_jax; git -C ~/maelm_jax fetch --quiet origin; git -C ~/maelm_jax checkout --quiet --detach $(shell_quote "$opt_revision")"
  else
    local tarball="/tmp/maelm_jax-$opt_name.tgz"
    run tar -C "$REPO_DIR" --exclude=.git --exclude=.venv --exclude=workdirs -czf "$tarball" .
    scp_to_workers "$tarball" maelm_jax.tgz  # relative: the home directory
    on_workers all "rm -rf ~/maelm_jax && mkdir ~/maelm_jax && tar -C ~/maelm_jax -xzf ~/maelm_jax.tgz"
  fi
  on_workers all "$REMOTE_WORKER install"
  on_workers all "$REMOTE_WORKER check --expect_devices=$((per_slice * ${opt_num_slices:-1}))"
}

# Training on every worker at once. Rerunning it is the resume: a worker whose recorded
# process still runs is left alone, the others start the same command, which resumes from
# the newest checkpoint in the workdir.
start_training() {
  [[ $opt_workdir == gs://* ]] || die "--workdir=$opt_workdir is not allowed: every host must see it; use gs://BUCKET/PATH"
  local args="" word
  for word in "--workdir=$opt_workdir" "--config=$opt_config" ${PASSTHROUGH[@]+--} "${PASSTHROUGH[@]}"; do
    args+=" $(shell_quote "$word")"
  done
  on_workers all "$REMOTE_WORKER start$args"
}
