"""The analytic FLOPs of one training step: what the model needs, by region.

Counts matmuls only (2 FLOPs per multiply-add), for the global batch of one optimizer step:

- every transformer layer on T query tokens that attend over S keys: the Q, K, V, O
  projections and the MLP, `2 T (4 E^2 + m E F)` with m = 2 matrices (GELU MLP) or 3
  (the modern backbone's GeGLU), plus the attention scores and the weighted values,
  `4 T S E` (bidirectional: every query sees every key). The modern backbone's local
  layers attend in query blocks to the `block + local_attention` keys their window can
  reach (model/attention.py), counted as computed: S is that span where it is shorter;
- the encoder runs on the tokens it sees: all L for MLM, the L - k visible ones for MAE-LM
  and 3ML; the self-attention decoder (MAE-LM, 3ML-self) runs on all L slots; the
  cross-attention decoder (3ML-cross) runs its self-attention and MLP on the k masked slots
  only, and cross-attends from them to the L - k encoder outputs (K and V projected there);
- the LM head runs on the k masked slots only: a dense E x E layer and the tied output
  projection E x V (V padded to a multiple of 128);
- forward + backward = 3 x forward (the backward computes the gradients of both operands
  of every matmul);
- the optimizer (global-norm clipping + AdamW) costs `OPTIMIZER_FLOPS_PER_PARAM` per
  parameter, whatever the batch.

Embedding lookups are gathers and their gradient a scatter-add: no matmuls, so the
"embedding" region is 0 here; XLA's count for it is the LayerNorm-free scatter-add, a few
FLOPs per token. What the formula leaves out (LayerNorm, GELU, softmax, dropout, bias adds,
the loss) is what XLA's cost analysis adds on top: `maelm_jax.flops` prints both, and
`TOLERANCE` bounds the gap. Rematerialisation is the implementation's choice, not the
model's, and is not counted (`maelm_jax.compile` reports what the chips execute).
"""

import dataclasses

import jax

from maelm_jax.config.run_config import RunConfig
from maelm_jax.model.masked_lm import MaskedLM, count_params, init_inputs

REGIONS = ("embedding", "encoder", "decoder", "lm_head", "optimizer")
FORWARD_BACKWARD = 3
# clip_by_global_norm (square + add, scale) and AdamW (two moment updates, bias
# corrections, sqrt, divide, weight decay, learning rate, apply): about what XLA counts.
OPTIMIZER_FLOPS_PER_PARAM = 20
# XLA's total over the analytic one: elementwise work the formula leaves out adds a few
# percent at base/large sizes and more at tiny ones (hidden 32: LayerNorm and softmax are
# then a large share). `maelm_jax.flops` flags rows outside [1, 1 + TOLERANCE].
TOLERANCE = 0.25


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the count depends on; `vocab` is the padded size."""

    objective: str
    decoder: str
    batch: int
    seq_len: int
    num_masked: int
    num_layers: int
    num_decoder_layers: int
    hidden: int
    mlp: int
    vocab: int
    mlp_matrices: int = 2  # 3 for the modern backbone's GeGLU
    global_every: int = 1  # the modern encoder's layer i is global iff i % global_every == 0
    local_span: int = 0  # keys a blocked local query block reads (0: no local layers)

    @classmethod
    def of(cls, run: RunConfig) -> "Shape":
        m = run.model
        return cls(
            objective=run.objective,
            decoder=m.decoder,
            batch=run.batch_size,
            seq_len=run.seq_len,
            num_masked=run.masking.num_masked,
            num_layers=m.num_layers,
            num_decoder_layers=m.num_decoder_layers,  # 0 for mlm
            hidden=m.hidden_size,
            mlp=m.mlp_dim,
            vocab=m.vocab_size,
            mlp_matrices=3 if m.modern else 2,
            global_every=m.global_attention_every_n_layers if m.modern else 1,
            local_span=m.local_attention_block + 2 * (m.local_attention // 2) if m.modern else 0,
        )

    @property
    def encoder_tokens(self) -> int:
        return self.seq_len if self.objective == "mlm" else self.seq_len - self.num_masked


def layer_forward(s: Shape, queries: int, keys: int) -> float:
    """One self-attention + MLP layer for one row: [queries, E] attending over `keys`."""
    e = s.hidden
    return 2 * queries * (4 * e * e + s.mlp_matrices * e * s.mlp) + 4 * queries * keys * e


def cross_layer_forward(s: Shape) -> float:
    """One 3ML-cross decoder layer for one row: k queries, L - k encoder outputs."""
    e, k, context = s.hidden, s.num_masked, s.seq_len - s.num_masked
    self_attention = 2 * k * 4 * e * e + 4 * k * k * e
    cross = 2 * k * 2 * e * e + 2 * context * 2 * e * e + 4 * k * context * e
    return self_attention + cross + 2 * k * s.mlp_matrices * e * s.mlp


def region_flops(run: RunConfig, num_params: int) -> dict[str, float]:
    """{region: FLOPs per optimizer step} for `run`'s global batch; `num_params` sizes the
    optimizer (e.g. `masked_lm.count_params` of the initialised parameters)."""
    s = Shape.of(run)
    t = s.encoder_tokens
    num_global = -(-s.num_layers // s.global_every)
    local_keys = min(t, s.local_span) if s.local_span and s.local_span < t else t
    encoder = num_global * layer_forward(s, t, t)
    encoder += (s.num_layers - num_global) * layer_forward(s, t, local_keys)
    if s.num_decoder_layers == 0:
        decoder = 0.0
    elif s.decoder == "self":
        decoder = s.num_decoder_layers * layer_forward(s, s.seq_len, s.seq_len)
    else:
        decoder = s.num_decoder_layers * cross_layer_forward(s)
    lm_head = 2 * s.num_masked * (s.hidden * s.hidden + s.hidden * s.vocab)
    per_row = {"embedding": 0.0, "encoder": encoder, "decoder": decoder, "lm_head": lm_head}
    out = {name: FORWARD_BACKWARD * s.batch * f for name, f in per_row.items()}
    out["optimizer"] = float(OPTIMIZER_FLOPS_PER_PARAM * num_params)
    return out


def step_flops(run: RunConfig, num_params: int) -> float:
    """Analytic FLOPs of one optimizer step (all regions, global batch)."""
    return sum(region_flops(run, num_params).values())


def num_params(run: RunConfig) -> int:
    """Parameters of `run`'s model, from shapes alone (nothing is allocated)."""
    model = MaskedLM(run.model, pad_id=0)  # special ids shape no parameter
    inputs = init_inputs(run.seq_len, run.masking.num_masked)
    return count_params(jax.eval_shape(model.init, jax.random.PRNGKey(0), *inputs)["params"])
