#!/usr/bin/env bash
# Every command a user types, on one GPU, each with its wall-clock and exit status (issue #62;
# docs/accelerators.md): the README's default run (shortened, float32 as shipped), `export`,
# `analysis` and `finetune --quick` of it, a micro `study` (two objectives, one task, one
# seed), then `main` and `export` under JAX_PLATFORMS=<the accelerator alone>, with no CPU
# backend in the process. Every step must exit 0; the script exits with the number that
# did not. Run it on a CPU first: ACCEL=cpu bash launch/gpu/paths.sh OUTDIR GLUE_DIR.
#
# Usage: [ACCEL=cuda] [PARTS=readme,export,analysis,finetune,study,accel_only[,bench,preset]]
#        [BENCH_ARGS="--finetune_encoder=6x512 ..."] [WORK=DIR]
#        bash launch/gpu/paths.sh OUTDIR GLUE_DIR
#   OUTDIR gets log.txt and summary.txt; the runs' folders go to WORK (default OUTDIR/work).
#   LIMIT_SCALE multiplies every step's time limit (the limits are an H200's; a 2-core CPU
#   rehearsal needs about 5).
#   bench (not in the default parts): `bench finetune`, the fine-tuning loop's variants.
#   preset (not in the default parts): `study --preset=gpu` whole (MLM, MAE-LM, random init,
#   3 seeds, four tasks), limited to the 9 minutes issue #63 gives it.
#   GLUE_DIR  GLUE's download (SST-2/, RTE/ with train.tsv and dev.tsv); no network needed.
# About 6 minutes on an H200 (budgeted: each step's limit below). Needs python3 with the
# project's packages (docs/gpu-logs/README.md says which wheels an image lacks).
# TensorFlow is optional: without it the default run's embedded corpus (python_docs, a TFDS
# dataset whose writer needs TensorFlow) is written once as text files and the run reads the
# same documents as `--config.dataset=text:...`; the log says which it was.
set -uo pipefail

out=${1:?usage: paths.sh OUTDIR GLUE_DIR}
glue=${2:?usage: paths.sh OUTDIR GLUE_DIR}
accel=${ACCEL:-cuda}
scale=${LIMIT_SCALE:-1}
parts=,${PARTS:-readme,export,analysis,finetune,study,accel_only},
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
glue=$(cd "$glue" && pwd) || exit 2
w=${WORK:-$out/work}
mkdir -p "$w"
w=$(cd "$w" && pwd)
cd "$repo" || exit 2
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 TFDS_DATA_DIR="$w/tfds"
failed=0
summary=()

wanted() { [[ $parts == *,$1,* ]]; }

step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a limit; records how it went
  local name=$1 limit=$(($2 * scale)) start=$SECONDS rc
  shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S): $*"
  timeout "$limit" "$@"
  rc=$?
  echo "=== $name: exit $rc, $((SECONDS - start)) s"
  summary+=("$(printf '%-22s exit %-3s %4s s' "$name" "$rc" "$((SECONDS - start))")")
  ((rc == 0)) || failed=$((failed + 1))
  return "$rc"
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import jax, torch, transformers; from maelm_jax.hardware import platforms
platforms.skip_absent_tpu(); print("jax", jax.__version__, jax.devices(), "torch",
torch.__version__, "transformers", transformers.__version__)'
python3 -c 'import importlib.util as u; print("mpi4py importable:", bool(u.find_spec("mpi4py")))'

data=()
if ! python3 -c 'import tensorflow' 2>/dev/null; then
  corpus=$w/python_docs
  step corpus_as_text 120 python3 - "$corpus" <<'EOF'
import os, sys
from maelm_jax.data import default_corpus

os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "python_docs.txt"), "w", encoding="utf-8") as f:
    f.write("\n\n".join(default_corpus.documents()) + "\n")
print("no TensorFlow: the embedded corpus as text,", sys.argv[1])
EOF
  data=("--config.dataset=text:$corpus/*.txt")
fi

if wanted readme; then
  step readme 150 python3 -m maelm_jax.main --config=configs/default.py --workdir="$w/default" \
    --config.num_train_steps=200 "${data[@]}"
fi
if wanted export; then
  step export 90 python3 -m maelm_jax.export --workdir="$w/default" --output_dir="$w/export"
fi
if wanted analysis; then
  step analysis 90 python3 -m maelm_jax.analysis --workdir="$w/default" \
    --output_dir="$w/analysis" --num_tokens=2048
fi
if wanted finetune; then
  step finetune_quick 120 python3 -m maelm_jax.finetune --export="$w/export" \
    --output_dir="$w/finetune" --quick --tasks=sst2 --glue_dir="$glue"
fi
if wanted study; then
  step micro_study 240 python3 -m maelm_jax.study --study_dir="$w/study" \
    --configs=configs/study/mlm.py,configs/study/mae_lm.py --tasks=rte --seeds=1 \
    --glue_dir="$glue" --max_steps=100 --rank_tokens=2048 \
    --overrides=num_train_steps=200,eval_every_steps=100,checkpoint_every_steps=200
  grep -h "JAX released\|GiB of the GPU free\|outlived" "$out/log.txt" | tail -3
fi
if wanted accel_only; then
  step "main ($accel only)" 120 env JAX_PLATFORMS="$accel" python3 -m maelm_jax.main \
    --config=configs/default.py --workdir="$w/accel_only" --config.num_train_steps=20 "${data[@]}"
  step "export ($accel only)" 90 env JAX_PLATFORMS="$accel" python3 -m maelm_jax.export \
    --workdir="$w/accel_only" --output_dir="$w/accel_only_export"
fi
if wanted preset; then
  step gpu_preset 540 python3 -m maelm_jax.study --preset=gpu --study_dir="$w/preset" \
    --glue_dir="$glue"
  [[ -f $w/preset/study.md ]] && cat "$w/preset/study.md"
fi
if wanted bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  step bench_finetune 150 python3 -m maelm_jax.bench finetune ${BENCH_ARGS:-}
fi

echo "=== summary ($failed failed)"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit "$failed"
