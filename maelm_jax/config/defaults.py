"""Every config key, its default and why: RoBERTa-base sizes, the MAE-LM objective, a pod mesh.

configs/base.py hands these to every config (variants call its `get_config()` and override;
`use_large_model` applies the large sizes), and `configdict.from_checkpoint` completes a
checkpoint's config written before a key existed from them. They live in the package so that
the package never imports the user's config files. Keys are documented once, here.

The training recipe is MAE-LM's base++ run exactly as the official script runs it
(yumeng5/MAE-LM `run_pretrain.sh`): 2M updates of 2048 x 512 tokens (32 per GPU on 64
GPUs), Adam betas (0.9, 0.98), eps 1e-6, peak lr 2e-4 after 10k warmup updates, linear
(polynomial power 1) decay to 0, clip norm 2.0, weight decay 0.01, dropout and attention
dropout 0.1. (The paper's appendix table could not be read from the stored material; the
script is the authors' own.) Other configs override it with their paper's values, cited in
their docstrings.
"""

import ml_collections
from ml_collections import config_dict

# Logical axis -> mesh axes. Model code names only the left column; a logical axis missing
# here is a configuration error, not a silent replication. Parameter axes come first, then
# the activation axes the model constrains at block boundaries.
DEFAULT_AXIS_RULES = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("position", None),
    ("relpos_buckets", None),
    ("layers", None),
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    # Objective and masking.
    c.objective = "mae_lm"  # "mlm" (RoBERTa baseline) | "mae_lm" (MAE-LM / 3ML)
    c.mask_rate = 0.15  # k = round(mask_rate * seq_len) masked slots in every row
    # "mlm" only: of the k slots, this share becomes <mask>, this share a random token, the
    # rest keep their token (RoBERTa's 80/10/10). "mae_lm" never corrupts: the encoder
    # simply does not see the masked slots.
    c.mlm_mask_prob = 0.8
    c.mlm_random_prob = 0.1
    c.seq_len = 512
    # "segmented": a token attends only within its own document of the packed block (the
    # official complete_doc blocks never mix documents; ours pack them end to end and
    # isolate them by segment ids, see maelm_jax/model/positions/segments.py). "concatenated":
    # the whole block attends to itself (RoBERTa FULL-SENTENCES), kept for comparison.
    c.packing = "segmented"
    c.batch_size = 2048  # global, across all processes
    c.num_train_steps = 2_000_000
    c.seed = 0
    # The generator of the dropout masks (the masking stays threefry): "threefry" (jax's
    # default, the same bits on every backend) | "rbg" | "unsafe_rbg" (XLA's RngBitGenerator,
    # as MaxText and t5x configure it: far cheaper masks on GPUs, bits that depend on the
    # backend and XLA version) | "auto" (unsafe_rbg on GPU, threefry elsewhere). Every
    # choice is a pure function of (seed, step), so a resumed run draws the masks an
    # uninterrupted one would on the same backend and jax version (docs/results.md).
    c.dropout_rng_impl = "auto"

    c.model = ml_collections.ConfigDict()
    c.model.num_layers = 12
    c.model.hidden_size = 768
    c.model.num_heads = 12
    c.model.mlp_dim = 3072
    c.model.decoder = "self"  # "self" (MAE-LM, 3ML-self) | "cross" (3ML-cross)
    c.model.num_decoder_layers = 4
    c.model.max_positions = 512
    c.model.dropout_rate = 0.1
    c.model.decoder_dropout_rate = 0.0  # MAE-LM trains its decoder without dropout
    # Dropout on attention probabilities: official MAE-LM uses 0.1 in the encoder and none in
    # the decoder (its decoder_attn_mode "zero-dropout"). 0 keeps the fused attention kernel.
    c.model.attention_dropout_rate = 0.1
    c.model.decoder_attention_dropout_rate = 0.0
    # What the decoders put at masked slots: "embedding_row" (official MAE-LM: the token
    # embedding's <mask> row, trained through the decoder) | "learned" (3ML: a separate vector).
    c.model.mask_token_source = "embedding_row"
    # Relative position bias (MAE-LM's bucketing), shared by all encoder layers; 0 turns it off.
    c.model.relative_attention_buckets = 0
    c.model.relative_attention_max_distance = 128
    # 0: the table starts normal(init_std), as official MAE-LM's does (attention starts
    # uniform). >0: bucket b starts at -slope * (b's nearest distance), an ALiBi-like prior
    # toward nearby tokens that short runs need to leave the unigram plateau (configs/default.py).
    c.model.relative_attention_init_slope = 0.0
    # >0: the encoder's prior stops falling at this distance, -slope * min(distance, cap), so
    # far tokens keep a share of attention that fine-tuning can use (configs/default.py).
    c.model.relative_attention_init_cap = 0.0
    # The decoder's own relative bias (same buckets, shared by the decoder's layers). Official
    # MAE-LM has none; the decoder is dropped after pretraining, so this never reaches export.
    c.model.decoder_relative_attention = False
    # Where the decoder's own bias table starts, as `relative_attention_init_slope` does the
    # encoder's: the local prior a short run needs to leave the plateau, never exported.
    # Unread without `decoder_relative_attention`.
    c.model.decoder_relative_attention_init_slope = 0.0
    c.model.dtype = "bfloat16"  # compute dtype; parameters are always float32
    c.model.scan_layers = True
    # Layers per iteration of the scanned stack's loop (the parameters stay stacked either
    # way, so checkpoints move between settings): 0 picks by platform, every layer on a GPU
    # (one straight-line program: an H200 ran mlm_base unrolled at 274k tokens/s against
    # 230k in a loop, whose per-iteration slices and stacks are device copies) and 1
    # elsewhere (a TPU compiles one layer and its estimates were measured so).
    c.model.scan_unroll = 0
    # MAE-LM's kept tokens (435 of 512 at 15%) pad to a multiple of this once, before the
    # encoder, in a segment of their own, and are cut after it: the same outputs. 0 picks by
    # platform: 8 where attention runs on cuDNN, which otherwise pads each layer's lengths to
    # 8 (178 pad kernels, 2.4 of 43.5 ms per modern_mae_lm_base step on an H200), and 1
    # elsewhere (on v5p-8 XLA's model put 440 rows 0.036 ms a layer dearer than 435).
    c.model.encoder_length_multiple = 0
    # "none" | "full" | "dots_saveable" (keep every weight matmul's output) | "dots_but_query"
    # (the same but the query projection, recomputed: maelm_jax/model/remat.py)
    c.model.remat_policy = "none"
    # The decoder's own policy. The decoder is shallow, full length and dropped after
    # pretraining, so "full" (keep only each layer's input) trades a second forward pass of
    # a few layers for the activations that otherwise limit MAE-LM's and 3ML's batch.
    c.model.decoder_remat_policy = "none"
    # >0: attention in blocks of this many queries, each recomputed in the backward pass, so
    # no layer holds [batch, heads, T, T] scores (maelm_jax/model/attention.py). 0: one block.
    c.model.attention_query_chunk = 0
    # >0: the training loss runs the LM head on blocks of this many masked slots, each
    # recomputed in the backward pass, so no [batch, k, vocab] logits exist
    # (maelm_jax/model/loss.py).
    c.model.lm_head_chunk = 0
    # Attention through a fused kernel: "auto" (cuDNN on GPU; xla on TPU, where splash is
    # untimed and holds more memory, and on CPU) |
    # "cudnn" (every attention: bias, segments and window included, dropout where
    # attention_dropout_impl says; model/kernels/cudnn.py) | "splash" (attentions without
    # a bias or dropout)
    # | "xla"; what a kernel does not take runs on xla. The TPU estimates (`compile`,
    # `flops`) count the xla path whatever this says: XLA's cost model sees nothing inside a
    # kernel (aot/compile_step.py).
    c.model.attention_impl = "auto"
    # Where dropout on the attention probabilities runs: "xla" (the step's dropout key:
    # masks a pure function of seed and step, so a resume draws what an uninterrupted run
    # would) | "cudnn" (inside cuDNN's fused kernel, which then takes every attention:
    # masks from cuDNN's own Philox counter, new at each step but not keyed by the step, so
    # a resume continues with other, equally random masks; mlm_base's step 1.24x faster on
    # an H200, docs/results.md; model/kernels/cudnn.py) | "auto": cuDNN wherever attention
    # runs on cuDNN.
    c.model.attention_dropout_impl = "auto"
    # True: q.k scores in float32 even in a bfloat16 model (the softmax always is); False is
    # t5x's and MaxText's default and cuts a third of an attention layer's time on a TPU.
    c.model.float32_attention_logits = False
    # True: each layer stack builds its relative bias once, a [batch, heads, T, S] bf16 array
    # every layer adds: MAE-LM large's estimated step 0.41 s against 0.51 on v5p-64 (under
    # the memory settings, before the bias was made in bf16), for ~1.3 GiB per chip at batch
    # 2048 and ~3% off its largest batch. False: each query block of each layer builds its
    # own from the [buckets, heads] table.
    c.model.relative_bias_once = True
    # Where the relative-bias table's gradient is contracted from the layers' [batch, heads,
    # T, S] score gradients: "per_layer" (each layer its own; XLA's TPU model prefers it) |
    # "summed" (summed over the layers in float32, contracted once: 2.0 ms against 11.5 ms
    # for MAE-LM base's twelve layers on an H200; costs a float32 copy of the bias and its
    # gradient) | "auto": summed on GPU, per layer elsewhere. The same gradient either way.
    c.model.relative_bias_grad = "auto"
    # How an attention with a relative bias computes it: "dense" (the bias as a [batch,
    # heads, T, S] array the kernel or XLA adds; the two keys above shape it) | "triton" (a
    # Pallas kernel on GPU that looks each score's bias up in the [buckets, heads] table and
    # sums the table's gradient itself, with its own dropout masks, a hash of the step's
    # key; model/kernels/relative_flash.py) | "auto": dense, everywhere. On an H200 the
    # kernel's layer took 4.1 ms against cuDNN's 2.8 to 3.2, mae_lm_base's step 102.2 ms
    # against 96.0 (docs/results.md, one H200, 2026-11-27 11:06).
    c.model.relative_bias_impl = "auto"
    # How a token lookup reads the embedding table, whose embedding axis is sharded (fsdp).
    # "never": each chip gathers its slice of the embedding for every token of the global
    # batch, and an all-to-all sends the vectors back to their rows' chips. "always": the
    # table is gathered whole in the compute dtype first and each chip looks up its own rows.
    # "always" wins where a chip's slice is narrow (under 128 lanes: the large configs on
    # v5p-64 hold 32 of 1024, base on v5p-64 24 of 768), "never" where it is wide (base on
    # v5p-8: 192 of 768); "auto" picks by that width on the run's mesh (docs/results.md,
    # "Pod preflight").
    c.model.gather_embedding_table = "auto"
    # How the token lookup's gradient is summed: "float32" (encoder.take_rows: a float32
    # scatter-add; the bfloat16 one was 61 of 195 ms of mlm_base's step on an H200) |
    # "compute_dtype" (the plain lookup's: in the compute dtype) |
    # "auto": compute_dtype on TPU, where XLA's cost model put the float32 form at 21.16
    # against 20.92 ms for mlm_base on v5p-8 (docs/results.md), float32 elsewhere.
    c.model.embedding_grad = "auto"
    c.model.layer_norm_epsilon = 1e-5
    c.model.init_std = 0.02
    # "roberta": the papers' post-LN encoder with learned absolute positions (and the T5
    # bias where configured). "modern": ModernBERT's (pre-LN, bias-free, GeGLU with mlp_dim
    # the GLU's width, rotary positions, alternating global/local attention; configs/modern_*,
    # docs/design.md). The keys below apply to "modern" only.
    c.model.backbone = "roberta"
    c.model.rope_theta_global = 160_000.0  # the global layers' rotary base
    c.model.rope_theta_local = 10_000.0  # the local layers'
    # A local layer's query sees keys within local_attention // 2 positions on either side,
    # measured in original positions (also between gathered kept tokens: model/positions/rotary.py).
    c.model.local_attention = 128
    # Layer i attends globally iff i % n == 0 (ModernBERT: every third, from the first);
    # 1: every layer global. The decoders of MAE-LM and 3ML are global throughout.
    c.model.global_attention_every_n_layers = 3
    # A local layer runs in blocks of this many queries, each against the block + 2 x
    # (local_attention // 2) keys its window can reach (model/attention.py): at 8192 tokens
    # and ModernBERT's window, 256 keys a query instead of 8192.
    c.model.local_attention_block = 128

    # Optimizer: AdamW with linear warmup and linear decay to zero; weight decay skips biases
    # and LayerNorm (fairseq decays everything, see maelm_jax/step/optimizer.py).
    # max_grad_norm 0 turns clipping off.
    c.learning_rate = 2e-4
    c.warmup_steps = 10_000
    c.weight_decay = 0.01
    c.adam_b1 = 0.9
    c.adam_b2 = 0.98
    c.adam_eps = 1e-6
    c.max_grad_norm = 2.0
    c.grad_accum_steps = 1

    # Data. `dataset` is a TFDS name ("wikipedia/20230601.en", "c4/en"), "text:<glob>" for
    # local files (documents separated by blank lines) or "python_docs", the embedded
    # corpus that needs no download.
    c.dataset = "wikipedia/20230601.en"
    c.data_dir = config_dict.placeholder(str)  # TFDS data_dir; None: TFDS's default
    c.train_split = "train"
    c.eval_split = ""  # "": hold out eval_holdout_fraction of the training documents
    c.eval_holdout_fraction = 0.005
    c.max_documents = 0  # >0 caps the documents read per split (a quick look at a corpus)
    c.vocab_path = config_dict.placeholder(str)  # SentencePiece model; None: train one
    c.vocab_size = 32768  # SentencePiece vocabulary; the model pads it to a multiple of 128
    c.tokenizer_train_documents = 200_000

    # Evaluation, logging, checkpoints.
    c.eval_every_steps = 2000
    c.eval_batches = 20
    c.log_every_steps = 100
    c.checkpoint_every_steps = 2000
    c.keep_checkpoints = 3
    c.keep_every_steps = 25_000
    c.init_from = config_dict.placeholder(str)  # checkpoint dir: weights only, step 0
    c.nonfinite = "stop"  # "stop" | "skip"
    c.profile_num_steps = 0  # >0: capture an XProf trace of this many steps (process 0)
    c.profile_start_step = 10  # the window's first step; after the first step (the compile)
    # MFU's denominator per device; 0: look the device up (maelm_jax/hardware/accelerators.py; CPUs
    # are not there, so a CPU run logs no MFU unless this is set).
    c.peak_flops_per_device = 0.0
    c.inject_nan_at_step = -1  # fault injection for tests: this step's loss becomes NaN

    # Device mesh: parallelism per axis within a slice (ici) and across slices (dcn);
    # -1 fills with whatever devices are left.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.ici = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    c.mesh.dcn = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
    c.logical_axis_rules = DEFAULT_AXIS_RULES
    return c


def use_large_model(
    c: ml_collections.ConfigDict, grad_accum_steps: int = 1
) -> ml_collections.ConfigDict:
    """RoBERTa-large sizes: 24 layers, width 1024, 16 heads, MLP 4096, each large config
    setting its own paper's recipe and, in `grad_accum_steps`, how many micro-batches its
    batch needs on v5p-64 (32 chips).

    Set for TPU time: nothing is recomputed in the backward pass and attention takes the whole
    sequence at once, and the batch goes in micro-batches small enough for what the layers
    then keep. XLA's estimate of one MAE-LM large encoder layer is 12.2 ms under
    `dots_saveable` against 9.4 ms without (v5p-8, 64 rows per chip): recomputing the
    attention of every layer was a quarter of the step. On v5p-64, mlm_large at 8192 in 8
    micro-batches: 59.68 GiB per chip, estimated MFU 58.0% (49.1% with the settings below);
    mae_lm_large at 2048 in 2: 65.56 GiB, 54.7% (39.8%) (docs/results.md, "Pod preflight").

    For the most rows per chip instead (a smaller slice, or `compile --max_batch`), the
    settings the large configs had before (docs/results.md, "Memory headroom"):
    `--config.model.remat_policy=dots_saveable --config.model.decoder_remat_policy=full
    --config.model.attention_query_chunk=128 --config.grad_accum_steps=1`. The LM head runs
    in blocks of 32 slots either way: its [B, k, vocab] float32 logits are the largest array
    of 3ML's step.
    """
    c.model.num_layers = 24
    c.model.hidden_size = 1024
    c.model.num_heads = 16
    c.model.mlp_dim = 4096
    c.model.remat_policy = "none"
    c.model.decoder_remat_policy = "none"
    c.model.attention_query_chunk = 0
    c.model.lm_head_chunk = 32
    c.grad_accum_steps = grad_accum_steps
    return c
