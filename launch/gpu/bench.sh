#!/usr/bin/env bash
# The GPU measurements behind docs/results.md, on one NVIDIA GPU, in named parts:
#   tests     tests/test_cudnn_attention.py and test_cudnn_dropout.py: cuDNN's attention
#             (and its dropout) against the XLA path
#   relative  the relative-bias kernel (model/kernels/relative_flash.py): its GPU test
#             against the dense attention, then benchmarks/relative_kernel_speed.py (one layer
#             against cuDNN's)
#   pair      mlm_base, mae_lm_base, mae_lm_base with its kept tokens padded inside each
#             cuDNN layer (model.encoder_length_multiple=1) rather than once, and mae_lm_base
#             with its encoder's attention in the relative-bias kernel, at 64 x 512 in one
#             process (~6 minutes): MAE-LM's time ratio, the open target, without the 3ML
#             compiles (the bias alone cost mlm_base 1.186x on 2026-11-27: results.md)
#   roberta   the train step per method at 64 x 512 (mlm_base first: the ratios are to it)
#   xla_dropout  mlm_base at 64 x 512 with attention dropout on XLA, in its own process
#   roberta_peer HuggingFace PyTorch RobertaForMaskedLM at 64 x 512: mlm_base's "ours / HF"
#   modern_peer  ModernBertForMaskedLM at 8 x 1024 and 32 x 1024: the modern configs'
#   compiled_peers  the two peers under torch.compile (issue #52), eager beside each in the
#             same process: RoBERTa at 64 x 512 and ModernBERT at 8 x 1024, default mode
#             (a training step's compile takes minutes; `torch_peer` takes compile-MODE)
#   modern    the modern backbone's methods at 8 x 1024
#   modern_pair  modern_mlm_base and modern_mae_lm_base at 8 x 1024, the latter also padded
#             per layer as `pair` does and with its decoder's remat "dots_saveable" (the
#             encoder's; its "none" stacks every residual in the loop) (~2 minutes): MAE-LM's
#             time ratio on the modern backbone without the 3ML compiles
#   modern32  modern_mlm_base at 32 x 1024, one process per setting, for its peak memory
#   before    mlm_base as the checkout BEFORE runs it, with its own jax_speed (skipped without
#             one, or if BEFORE predates maelm_jax/benchmarks/)
#   variants  mlm_base with one GPU default undone at a time
#   mae_variants  mae_lm_base with its bias's gradient summed (the GPU default) and per layer
#   bias      benchmarks/bias_speed.py: MAE-LM's per-example relative bias, piece by piece
#   kernels   python -m maelm_jax.bench kernels on mlm_base and mae_lm_base: kernels by category
# Each part has a time limit and the next runs whatever happened. Everything lands in
# OUTDIR/log.txt and OUTDIR/results.tgz (every part's JSON). The measurements themselves are
# maelm_jax/benchmarks/ (`python -m maelm_jax.benchmarks.<name>`), run from the checkout's
# root, whose package and configs they use.
#
# Usage: bash launch/gpu/bench.sh OUTDIR [BEFORE_CHECKOUT|-] [PART,PART,...]
# Default parts: all, about 30 minutes on an H200 before compiled_peers was added (its two
# limits allow 12 more; not yet run on a GPU). A roberta-size config compiles in 39 to 85 s
# in a group, mae_lm_base the longest; the roberta group of four ran 6 minutes. A lease of
# 15 minutes of device time takes them in three calls or more. The groups log each
# config's compile and each round's ms/step as they go, so a part cut off by its limit
# still says what it measured.
# Needs python3 with jax[cuda], flax, optax, orbax-checkpoint, sentencepiece, ml-collections,
# clu, torch and transformers; TensorFlow is not needed (jax_speed stands in for it).
set -uo pipefail

all=tests,relative,pair,roberta,xla_dropout,roberta_peer,modern_peer,compiled_peers,modern,modern_pair,modern32,before,variants,mae_variants,bias,kernels
out=${1:?usage: bench.sh OUTDIR [BEFORE_CHECKOUT|-] [PART,...] (parts: $all)}
before=${2:--}
parts=,${3:-$all},
for name in ${parts//,/ }; do
  if [[ ,$all, != *,$name,* ]]; then
    echo "unknown part '$name': use a comma-separated list of $all" >&2
    exit 2
  fi
done
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# The benchmarks run from a checkout's root: OUTDIR and BEFORE become absolute first.
mkdir -p "$out/results"
out=$(cd "$out" && pwd)
if [[ $before != - ]]; then
  if ! before=$(cd "$before" 2>/dev/null && pwd); then
    echo "BEFORE_CHECKOUT '$2': no such directory" >&2
    exit 2
  fi
fi
results=$out/results
cd "$repo" || exit 1
exec > >(tee -a "$out/log.txt") 2>&1
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

wanted() { [[ $parts == *,$1,* ]]; }

part() {  # part SECONDS NAME COMMAND...: runs COMMAND under a time limit, says how it went
  local limit=$1 name=$2 start=$SECONDS
  shift 2
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout "$limit" "$@"
  echo "=== $name: exit $?, $((SECONDS - start)) s"
}

speed=(python3 -m maelm_jax.benchmarks.jax_speed)  # OUTDIR GROUP...: groups, this checkout

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import jax, flax, torch, transformers; print("jax", jax.__version__, "flax",
flax.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'

if wanted tests; then
  # No conftest: it sets the CPU test session's XLA flags.
  part 100 tests env JAX_PLATFORMS=cuda python3 -m pytest -q -rA -o addopts="" \
    -p no:cacheprovider --noconftest "$repo/tests/test_cudnn_attention.py" \
    "$repo/tests/test_cudnn_dropout.py"
fi
if wanted relative; then
  part 60 "relative: GPU test" env JAX_PLATFORMS=cuda python3 -m pytest -q -rA -o addopts="" \
    -p no:cacheprovider --noconftest "$repo/tests/test_relative_flash.py" -k on_a_gpu
  part 150 "relative: speed" python3 -m maelm_jax.benchmarks.relative_kernel_speed \
    "$results"
fi
if wanted pair; then
  part 380 pair "${speed[@]}" "$results" \
    pair=mlm_base+mae_lm_base+mae_lm_base:model.encoder_length_multiple=1+mae_lm_base:model.relative_bias_impl=triton@64x512
fi
if wanted roberta; then
  part 420 roberta "${speed[@]}" "$results" \
    roberta=mlm_base+mae_lm_base+three_ml_self_base+three_ml_cross_base@64x512
fi
if wanted xla_dropout; then
  # A process of its own: an abort in cuDNN's dropout (kernels/cudnn.py) cannot take it.
  part 90 xla_dropout "${speed[@]}" "$results" \
    xla_dropout=mlm_base:model.attention_dropout_impl=xla@64x512
fi
# Each peer at its counterpart's vocabulary: configs/base.py's 32768, modern.py's 50368.
if wanted roberta_peer; then
  part 60 "peers: RoBERTa" python3 -m maelm_jax.benchmarks.torch_peer "$results" 32768 \
    roberta=roberta-base@64x512
fi
if wanted modern_peer; then
  part 80 "peers: ModernBERT" python3 -m maelm_jax.benchmarks.torch_peer "$results" 50368 \
    mb8=modernbert-base@8x1024 mb32=modernbert-base@32x1024
fi
if wanted compiled_peers; then
  part 420 "peers: torch.compile" python3 -m maelm_jax.benchmarks.torch_peer "$results" 32768 \
    roberta_eager=roberta-base@64x512 roberta_compile=roberta-base@64x512:compile
  part 300 "peers: ModernBERT, torch.compile" python3 -m maelm_jax.benchmarks.torch_peer \
    "$results" 50368 mb8_eager=modernbert-base@8x1024 mb8_compile=modernbert-base@8x1024:compile
fi
if wanted modern; then
  part 240 modern "${speed[@]}" "$results" \
    modern8=modern_mlm_base+modern_mae_lm_base+modern_three_ml_self_base+modern_three_ml_cross_base@8x1024
fi
if wanted modern_pair; then
  part 160 modern_pair "${speed[@]}" "$results" \
    modern_pair=modern_mlm_base+modern_mae_lm_base+modern_mae_lm_base:model.encoder_length_multiple=1+modern_mae_lm_base:model.decoder_remat_policy=dots_saveable@8x1024
fi
if wanted modern32; then
  part 90 "modern32: as shipped" "${speed[@]}" "$results" \
    modern32=modern_mlm_base@32x1024
  part 120 "modern32: no remat" "${speed[@]}" "$results" \
    modern32_noremat=modern_mlm_base:model.remat_policy=none@32x1024
fi
if wanted before && [[ $before != - ]]; then
  if [[ -f $before/maelm_jax/benchmarks/jax_speed.py ]]; then
    part 90 before env -C "$before" "${speed[@]}" "$results" before=mlm_base@64x512
  else
    echo "=== before: $before has no maelm_jax/benchmarks/jax_speed.py (it predates them): skipped"
  fi
fi
if wanted variants; then
  part 240 variants "${speed[@]}" "$results" \
    variants=mlm_base+mlm_base:dropout_rng_impl=threefry+mlm_base:model.scan_unroll=1+mlm_base:model.attention_dropout_rate=0.0
fi
if wanted mae_variants; then
  part 240 mae_variants "${speed[@]}" "$results" \
    mae_variants=mae_lm_base+mae_lm_base:model.relative_bias_grad=per_layer@64x512
fi
if wanted bias; then
  part 120 bias python3 -m maelm_jax.benchmarks.bias_speed "$results"
fi
if wanted kernels; then
  part 300 kernels python3 -m maelm_jax.benchmarks.kernel_table \
    --configs=mlm_base,mae_lm_base --batch_size=64 --seq_len=512 --steps=3 --top=15
fi

tar -czf "$out/results.tgz" -C "$out" results
echo "=== done $(date -u +%H:%M:%S)"
