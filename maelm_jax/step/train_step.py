"""Pure step functions: `(state, batch) -> (state, metrics)` and the eval counterpart.

Configuration is bound with `functools.partial` before `jax.jit`, so the jitted functions
take only arrays. All randomness comes from `fold_in(PRNGKey(seed), step)`: a step's masks
and dropout never depend on what ran before, which is what makes a resumed run identical
to an uninterrupted one. Masking happens once on the global batch *before* it is split into
micro-batches, so gradient accumulation does not change which tokens are masked.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from maelm_jax.config.run_config import MaskingConfig
from maelm_jax.model import logical_axes as ax
from maelm_jax.model import loss, masking
from maelm_jax.step.train_state import TrainState

_EVAL_STREAM = 0x5EED  # eval masks come from their own stream, fixed for the whole run


def step_rngs(seed: int, step: jax.Array, dropout_rng_impl: str = "threefry"):
    """(mask_rng, dropout_rng) for one step; a pure function of (seed, step).

    The dropout key is of `dropout_rng_impl` (a jax PRNG implementation): with "threefry" it
    is the threefry key it always was; otherwise a typed key of that implementation whose
    seed words are drawn from the threefry one, so it too depends on (seed, step) alone.
    Dropout draws a mask per layer of [B, T, E] bits (and [B, N, T, S] on XLA's attention
    path); threefry's hash made them inside the elementwise fusions that were 27% of
    mlm_base's step on an H200, and XLA's RngBitGenerator ("rbg", "unsafe_rbg") makes bits
    with far less arithmetic (docs/results.md: the GPU default; its share was not timed
    alone).
    """
    mask_rng, dropout_rng = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), step))
    if dropout_rng_impl != "threefry":
        words = jax.random.key_data(jax.random.key(0, impl=dropout_rng_impl)).shape
        seed_words = jax.random.bits(dropout_rng, words, jnp.uint32)
        dropout_rng = jax.random.wrap_key_data(seed_words, impl=dropout_rng_impl)
    return mask_rng, dropout_rng


def _microbatches(tree, num: int):
    """[B, ...] -> [num, B / num, ...] where micro-batch i holds rows i, i+num, i+2*num, ...

    Interleaving (rather than contiguous chunks) keeps every micro-batch spread evenly over
    the devices that shard the batch axis, so the split needs no communication.
    """

    def split(x):
        x = x.reshape((x.shape[0] // num, num, *x.shape[1:])).swapaxes(0, 1)
        names = (None, "activation_batch") + (None,) * (x.ndim - 2)
        return ax.constrain(x, names)

    return jax.tree_util.tree_map(split, tree)


def loss_sums(params, batch: masking.MaskedBatch, dropout_rng, model: nn.Module):
    """(loss_sum, all sums) of one masked batch in training mode (dropout on); the LM head
    and loss in blocks of `model.config.lm_head_chunk` slots when k is larger."""
    variables = {"params": params}
    hidden = model.apply(
        variables,
        batch.input_ids,
        batch.masked_idx,
        batch.visible_idx,
        deterministic=False,
        segment_ids=batch.segment_ids,
        rngs={"dropout": dropout_rng},
        method=model.masked_hidden,
    )
    head = functools.partial(model.apply, variables, method=model.logits)
    chunk = model.config.lm_head_chunk
    if chunk and hidden.shape[1] > chunk:
        with jax.named_scope("loss"):
            sums = loss.chunked_masked_lm_sums(
                head, hidden, batch.labels, batch.mask_weights, chunk
            )
        return sums["loss_sum"], sums
    logits = head(hidden)
    with jax.named_scope("loss"):
        sums = loss.masked_lm_sums(logits, batch.labels, batch.mask_weights)
    return sums["loss_sum"], sums


def train_step(
    state: TrainState,
    batch: dict,
    *,
    model: nn.Module,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    masking_cfg: MaskingConfig,
    seed: int,
    grad_accum_steps: int = 1,
    inject_nan_at_step: int = -1,
    dropout_rng_impl: str = "threefry",
):
    """One optimizer update on the global batch {"input_ids": [B, L] int32}.

    Document segment ids are derived from the blocks inside the step
    (model/positions/segments.py), so the batch stays one array.

    An update whose loss or gradient norm is not finite is dropped (params and optimizer
    state kept, `skipped_updates` incremented); the host decides whether that stops the run.
    `inject_nan_at_step` exists for fault-injection tests only.
    """
    mask_rng, dropout_rng = step_rngs(seed, state.step, dropout_rng_impl)
    masked = masking.mask_batch(mask_rng, batch["input_ids"], masking_cfg)
    grad_fn = jax.grad(loss_sums, has_aux=True)

    def accumulate(carry, micro):
        grads, sums = carry
        i, micro_batch = micro
        g, s = grad_fn(state.params, micro_batch, jax.random.fold_in(dropout_rng, i), model)
        return (jax.tree_util.tree_map(jnp.add, grads, g), {k: sums[k] + s[k] for k in s}), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
    zero_sums = {k: jnp.zeros((), jnp.float32) for k in ("loss_sum", "correct_sum", "weight_sum")}
    micro = (jnp.arange(grad_accum_steps), _microbatches(masked, grad_accum_steps))
    (grads, sums), _ = jax.lax.scan(accumulate, (zeros, zero_sums), micro)

    denominator = jnp.maximum(sums["weight_sum"], 1.0)
    grads = jax.tree_util.tree_map(lambda g: g / denominator, grads)
    mean = sums["loss_sum"] / denominator
    mean = jnp.where(state.step == inject_nan_at_step, jnp.nan, mean)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(mean) & jnp.isfinite(grad_norm)

    with jax.named_scope("optimizer"):
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    keep_new = lambda new, old: jnp.where(finite, new, old)
    new_state = state.replace(
        step=state.step + 1,
        params=jax.tree_util.tree_map(keep_new, params, state.params),
        opt_state=jax.tree_util.tree_map(keep_new, opt_state, state.opt_state),
        skipped_updates=state.skipped_updates + (~finite).astype(jnp.int32),
    )
    metrics = dict(
        sums,
        loss=mean,
        grad_norm=grad_norm,
        learning_rate=schedule(state.step),
        nonfinite=(~finite).astype(jnp.int32),
    )
    return new_state, metrics


def eval_masks(input_ids, index, *, masking_cfg: MaskingConfig, seed) -> masking.MaskedBatch:
    """The masks of eval batch `index` ([B, L] ids): fixed by (seed, index) for the whole
    run, so every evaluation scores the same slots."""
    rng = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), _EVAL_STREAM), index)
    return masking.mask_batch(rng, input_ids, masking_cfg)


def eval_logits(params, masked: masking.MaskedBatch, model: nn.Module) -> jax.Array:
    """The model in eval mode (no dropout) on a masked batch -> logits [B, k, V]."""
    return model.apply(
        {"params": params},
        masked.input_ids,
        masked.masked_idx,
        masked.visible_idx,
        segment_ids=masked.segment_ids,
    )


def eval_step(
    params, batch: dict, index: jax.Array, *, model: nn.Module, masking_cfg: MaskingConfig, seed
):
    """Masked-token sums on one eval batch; masks depend only on (seed, batch index), so
    every evaluation of the run scores the same slots."""
    masked = eval_masks(batch["input_ids"], index, masking_cfg=masking_cfg, seed=seed)
    logits = eval_logits(params, masked, model)
    return loss.masked_lm_sums(logits, masked.labels, masked.mask_weights)
