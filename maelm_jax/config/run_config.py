"""The run's configuration as the code below the commands sees it: frozen, typed parts.

A command parses the user's ConfigDict (configs/*.py plus `--config.key=value`) and turns it
into one `RunConfig` right away (`configdict.freeze`, which validates every value first);
nothing below the commands reads a ConfigDict. Frozen dataclasses let a jitted function
close over a config safely, and a bad value fails once, up front, with a message naming it.

Some parts copy a top-level key they need (`seq_len`, `batch_size`, `seed` are in `data`
too, `num_train_steps` in `optimizer` and `loop`), so that each consumer takes only its
part. A run is therefore changed with `configdict.override`, which edits the keys and
freezes again, never with `dataclasses.replace` on one part, which would leave the copies
behind.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

OBJECTIVES = ("mlm", "mae_lm")
DECODERS = ("self", "cross")
NONFINITE_POLICIES = ("stop", "skip")
PACKINGS = ("segmented", "concatenated")  # see model/positions/segments.py
# The study's own corpus, its tasks' unlabeled train text (studies/task_text.py): a dataset
# only `python -m maelm_jax.study` can resolve, since the text is written into the study dir
# (the data layer refuses it elsewhere: data/documents.py).
STUDY_TASK_TEXT = "study:task_text"
MASK_TOKEN_SOURCES = ("embedding_row", "learned")  # see model/masked_lm.py
ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn")  # see ModelConfig.for_platform
ATTENTION_DROPOUT_IMPLS = ("auto", "xla", "cudnn")  # see ModelConfig.for_platform
TABLE_GATHERS = ("auto", "always", "never")  # see ModelConfig.for_embedding_shards
DROPOUT_RNG_IMPLS = ("auto", "threefry", "rbg", "unsafe_rbg")  # see dropout_rng_impl_for
EMBEDDING_GRADS = ("auto", "float32", "compute_dtype")  # see ModelConfig.for_platform
RELATIVE_BIAS_GRADS = ("auto", "per_layer", "summed")  # see ModelConfig.for_platform
RELATIVE_BIAS_IMPLS = ("auto", "dense", "triton")  # see ModelConfig.for_platform
# A TPU vector register's minor dimension: an embedding slice narrower than this per chip
# pads to it in the sharded lookup's relayout (encoder.TokenEmbedding).
TPU_LANES = 128
BACKBONES = ("roberta", "modern")  # see configs/base.py
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
VOCAB_MULTIPLE = 128
# `scan_unroll` 0 on a GPU: more layers than any stack has, so every stack runs unrolled.
GPU_UNROLL = 1 << 16
# cuDNN's attention with a bias takes lengths in multiples of this (model/kernels/cudnn.py).
CUDNN_LENGTH_MULTIPLE = 8
# The relative-bias kernel's query and key block (model/kernels/relative_flash.py).
TRITON_BLOCK = 64


def dropout_rng_impl_for(impl: str, platform: str | None) -> str:
    """The dropout generator `impl` ("auto" or a jax PRNG implementation's name) names on
    `platform`'s devices: "auto" is unsafe_rbg on GPU, threefry elsewhere (configs/base.py)."""
    if impl != "auto":
        return impl
    return "unsafe_rbg" if platform == "gpu" else "threefry"


class ConfigError(ValueError):
    """A user-supplied value (config, path, data) is not allowed; the message says why."""


def padded_vocab_size(vocab_size: int) -> int:
    """Rounds up to a multiple of 128 so the vocab axis tiles and shards evenly."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def num_masked(mask_rate: float, seq_len: int) -> int:
    """The static k: every row has exactly this many masked slots."""
    return round(mask_rate * seq_len)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What the model code needs; `vocab_size` is already padded."""

    objective: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_heads: int
    mlp_dim: int
    decoder: str
    num_decoder_layers: int
    max_positions: int
    dropout_rate: float
    decoder_dropout_rate: float
    attention_dropout_rate: float
    decoder_attention_dropout_rate: float
    mask_token_source: str
    relative_attention_buckets: int
    relative_attention_max_distance: int
    relative_attention_init_slope: float
    relative_attention_init_cap: float
    decoder_relative_attention: bool
    decoder_relative_attention_init_slope: float
    dtype: Any
    scan_layers: bool
    remat_policy: str
    decoder_remat_policy: str
    attention_query_chunk: int
    lm_head_chunk: int
    layer_norm_epsilon: float
    init_std: float
    attention_impl: str = "xla"  # ATTENTION_IMPLS; `for_platform` makes "auto" concrete
    # Where attention-probability dropout runs: ATTENTION_DROPOUT_IMPLS (configs/base.py).
    attention_dropout_impl: str = "xla"
    float32_attention_logits: bool = False
    relative_bias_once: bool = True  # see configs/base.py
    relative_bias_grad: str = "per_layer"  # RELATIVE_BIAS_GRADS; see configs/base.py
    relative_bias_impl: str = "dense"  # RELATIVE_BIAS_IMPLS; see configs/base.py
    gather_embedding_table: str = "never"  # TABLE_GATHERS; see configs/base.py
    kernel_interpret: bool = False  # Pallas kernels in the interpreter (on CPU)
    backbone: str = "roberta"  # BACKBONES; the keys below are the "modern" backbone's
    rope_theta_global: float = 160_000.0
    rope_theta_local: float = 10_000.0
    local_attention: int = 128  # a local query sees keys within local_attention // 2
    global_attention_every_n_layers: int = 3
    local_attention_block: int = 128  # queries per block of a local layer (attention.py)
    scan_unroll: int = 1  # layers per loop iteration of a scanned stack; 0: `for_platform`
    # How the token embedding's gradient is summed (encoder.take_rows): EMBEDDING_GRADS.
    embedding_grad: str = "compute_dtype"
    # The MAE-LM encoder's kept tokens pad to a multiple of this (masked_lm.py); 0:
    # `for_platform` (cuDNN's length multiple where attention runs there, else 1).
    encoder_length_multiple: int = 1

    def layers_per_iteration(self, num_layers: int) -> int:
        """What `nn.scan` unrolls for a stack of `num_layers`: `scan_unroll` layers, all of
        them where it is 0 ("auto" not made concrete: one) or larger than the stack."""
        return max(1, min(self.scan_unroll or 1, num_layers))

    @property
    def modern(self) -> bool:
        return self.backbone == "modern"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def _scanned_dropout_stacks(self) -> list[str]:
        """Stacks whose attention dropout a scan loop runs through one call site."""
        stacks = [("encoder", self.num_layers, self.attention_dropout_rate)]
        if self.objective == "mae_lm":
            stacks.append(("decoder", self.num_decoder_layers, self.decoder_attention_dropout_rate))
        return [
            f"{name} ({n} layers, {self.layers_per_iteration(n)} a loop iteration)"
            for name, n, rate in stacks
            if rate > 0 and self.scan_layers and self.layers_per_iteration(n) < n
        ]

    def for_platform(self, platform: str) -> "ModelConfig":
        """This model on `platform`'s devices ("tpu", "gpu" for NVIDIA's, "rocm" for AMD's,
        "cpu"; `hardware.platforms.kernel_platform` names a device's): `attention_impl`
        "auto" becomes cuDNN on an NVIDIA GPU for a bfloat16 model (cuDNN takes 16-bit
        inputs only; timed: docs/results.md) and xla elsewhere, TPUs included until splash
        is timed on one (as integrated it holds more memory, not less: docs/results.md,
        "Splash attention's memory"); an explicit kernel must run where it
        exists (splash runs on CPU, in the Pallas interpreter, for tests). Until then "auto"
        computes as "xla", so a model built without devices in mind (export, analysis) is
        the XLA one.
        `scan_unroll` 0 becomes every layer on GPU, else 1; `embedding_grad` "auto" the
        float32 sum except on TPU (configs/base.py says why); `attention_dropout_impl`
        "auto" cuDNN where attention runs on cuDNN and no scan loop shares a call site
        (cuDNN's masks follow a counter per call site: model/kernels/cudnn.py);
        `relative_bias_grad` "auto" summed over the layers on GPU, per layer elsewhere;
        `relative_bias_impl` "auto" the dense bias ("triton" runs on GPU, and on CPU in the
        Pallas interpreter for tests); `encoder_length_multiple` 0 the relative-bias
        kernel's block where that kernel runs, cuDNN's multiple where attention runs there."""
        gpu_like = platform in ("gpu", "rocm")
        sixteen_bit = jnp.dtype(self.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        impl = self.attention_impl
        if impl == "auto":
            impl = "cudnn" if platform == "gpu" and sixteen_bit else "xla"
        kernel_platforms = {"splash": ("tpu", "cpu"), "cudnn": ("gpu",)}
        if platform not in kernel_platforms.get(impl, (platform,)):
            raise ConfigError(
                f"model.attention_impl={impl!r} cannot run on {platform} devices; use "
                f"'auto' or 'xla' (splash: TPU, cudnn: NVIDIA GPU)"
            )
        if impl == "cudnn" and not sixteen_bit:
            raise ConfigError(
                "model.attention_impl='cudnn' takes a 16-bit model, not model.dtype="
                f"{jnp.dtype(self.dtype).name}; use 'auto' or 'xla', or model.dtype='bfloat16'"
            )
        bias_impl = "dense" if self.relative_bias_impl == "auto" else self.relative_bias_impl
        if bias_impl == "triton" and platform not in ("gpu", "cpu"):
            raise ConfigError(
                f"model.relative_bias_impl='triton' cannot run on {platform} devices; use "
                "'auto' or 'dense' (triton: NVIDIA GPU)"
            )
        bias_kernel = bias_impl == "triton" and self.relative_attention_buckets > 0
        buckets, head = self.relative_attention_buckets, self.head_dim
        if bias_kernel and not (_power_of_two(buckets) and buckets <= 128 and _power_of_two(head)):
            raise ConfigError(
                f"model.relative_bias_impl='triton' takes a power-of-two head size and bucket "
                f"count (at most 128), not head size {head} (hidden_size / num_heads) and "
                f"model.relative_attention_buckets={buckets}; use 'dense'"
            )
        interpret = platform == "cpu" and (impl == "splash" or bias_kernel)
        unroll = self.scan_unroll or (GPU_UNROLL if gpu_like else 1)
        multiple = self.encoder_length_multiple
        if not multiple:
            multiple = CUDNN_LENGTH_MULTIPLE if impl == "cudnn" else 1
            multiple = TRITON_BLOCK if bias_kernel else multiple
        grad = self.embedding_grad
        if grad == "auto":
            grad = "compute_dtype" if platform == "tpu" else "float32"
        looped = dataclasses.replace(self, scan_unroll=unroll)._scanned_dropout_stacks()
        dropout_impl = self.attention_dropout_impl
        if dropout_impl == "auto":
            dropout_impl = "cudnn" if impl == "cudnn" and not looped else "xla"
        if dropout_impl == "cudnn" and impl != "cudnn":
            raise ConfigError(
                f"model.attention_dropout_impl='cudnn' needs model.attention_impl 'cudnn' (or "
                f"'auto' on GPU), not {impl!r} on {platform} devices; use 'auto' or 'xla'"
            )
        if dropout_impl == "cudnn" and looped:
            raise ConfigError(
                f"model.attention_dropout_impl='cudnn' in a scan loop ({', '.join(looped)}) "
                "pairs a layer's backward with another layer's dropout mask; use 'auto' or "
                "'xla', or model.scan_unroll=0 (every layer unrolled on GPU)"
            )
        bias_grad = self.relative_bias_grad
        if bias_grad == "auto":
            bias_grad = "summed" if gpu_like else "per_layer"
        return dataclasses.replace(
            self,
            attention_impl=impl,
            attention_dropout_impl=dropout_impl,
            relative_bias_grad=bias_grad,
            relative_bias_impl=bias_impl,
            kernel_interpret=interpret,
            scan_unroll=unroll,
            embedding_grad=grad,
            encoder_length_multiple=multiple,
        )

    def for_embedding_shards(self, shards: int) -> "ModelConfig":
        """This model with the embedding axis split `shards` ways: `gather_embedding_table`
        "auto" becomes "always" where that leaves each chip a slice narrower than a TPU
        vector's lanes, else "never" (encoder.TokenEmbedding says why). A model built
        without a mesh (export, analysis) looks tokens up as "never" does: the same values."""
        if self.gather_embedding_table != "auto":
            return self
        narrow = shards > 1 and self.hidden_size // shards < TPU_LANES
        return dataclasses.replace(self, gather_embedding_table="always" if narrow else "never")

    def for_vocab(self, vocab_size: int) -> "ModelConfig":
        """This model for a tokenizer of `vocab_size` pieces (padded here)."""
        return dataclasses.replace(self, vocab_size=padded_vocab_size(vocab_size))


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """How rows are masked; the special ids come from the tokenizer."""

    objective: str
    seq_len: int
    num_masked: int
    mlm_mask_prob: float
    mlm_random_prob: float
    vocab_size: int  # the tokenizer's (unpadded): random replacements stay inside it
    mask_id: int
    pad_id: int
    eos_id: int  # ends every document in a block: segment ids follow from it
    packing: str  # "segmented" | "concatenated", see model/positions/segments.py
    special_ids: tuple[int, ...]  # never chosen while a row has enough other tokens
    first_regular_id: int  # random replacements are drawn from [first_regular_id, vocab_size)


@dataclasses.dataclass(frozen=True)
class MaskingSettings:
    """The run's masking keys; `for_tokenizer` adds a tokenizer's ids to make a
    `MaskingConfig` (the ids are the tokenizer's business, not the config's)."""

    objective: str
    mask_rate: float
    seq_len: int
    num_masked: int
    mlm_mask_prob: float
    mlm_random_prob: float
    packing: str

    def for_tokenizer(
        self,
        *,
        vocab_size: int,
        mask_id: int,
        pad_id: int,
        eos_id: int,
        special_ids: tuple[int, ...],
        first_regular_id: int,
    ) -> MaskingConfig:
        return MaskingConfig(
            objective=self.objective,
            seq_len=self.seq_len,
            num_masked=self.num_masked,
            mlm_mask_prob=self.mlm_mask_prob,
            mlm_random_prob=self.mlm_random_prob,
            vocab_size=vocab_size,
            mask_id=mask_id,
            pad_id=pad_id,
            eos_id=eos_id,
            packing=self.packing,
            special_ids=tuple(special_ids),
            first_regular_id=first_regular_id,
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data keys; paths already through `paths.resolve` (`file://` URLs become local
    paths, gs:// stays)."""

    dataset: str
    data_dir: str | None  # None: TFDS's default
    train_split: str
    eval_split: str
    eval_holdout_fraction: float
    max_documents: int
    seq_len: int
    batch_size: int  # global rows per step
    eval_batches: int
    seed: int
    vocab_path: str | None
    vocab_size: int
    tokenizer_train_documents: int


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its schedule (step/optimizer.py)."""

    learning_rate: float
    warmup_steps: int
    num_train_steps: int  # the schedule decays to zero here
    weight_decay: float
    adam_b1: float
    adam_b2: float
    adam_eps: float
    max_grad_norm: float  # 0: no clipping


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the training loop does around the step: how long, how often, what on failure."""

    num_train_steps: int
    seed: int
    grad_accum_steps: int
    eval_every_steps: int
    eval_batches: int
    log_every_steps: int
    nonfinite: str  # "stop" | "skip"
    profile_num_steps: int
    profile_start_step: int
    peak_flops_per_device: float  # 0: look the device up (hardware/accelerators.py)
    inject_nan_at_step: int  # fault injection for tests; -1: never
    init_from: str | None  # a checkpoint directory: weights only, step 0
    dropout_rng_impl: str = "threefry"  # DROPOUT_RNG_IMPLS; `dropout_rng_impl_for` resolves


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int
    keep: int
    keep_every_steps: int  # 0: keep none beyond the newest `keep`


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Parallelism per mesh axis within a slice (`ici`) and across slices (`dcn`), -1 filling
    with what is left; the logical-axis rules that map model axes onto them."""

    ici: tuple[tuple[str, int], ...]
    dcn: tuple[tuple[str, int], ...]
    logical_axis_rules: tuple[tuple[str, str | tuple[str, ...] | None], ...]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run, frozen: the keys every part shares, then the parts."""

    objective: str
    seq_len: int
    batch_size: int  # global, across all processes
    seed: int
    model: ModelConfig  # vocab padded from the config's vocab_size; `for_vocab` re-pads
    masking: MaskingSettings
    data: DataConfig
    optimizer: OptimizerConfig
    loop: LoopConfig
    checkpoint: CheckpointConfig
    mesh: MeshConfig
    # The ConfigDict as JSON: what a checkpoint stores, and what `configdict.override`
    # edits and freezes again.
    source_json: str = dataclasses.field(repr=False)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
