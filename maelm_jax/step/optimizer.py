"""AdamW with RoBERTa's settings: linear warmup, linear decay, global-norm clipping.

Weight-decay scope differs from the papers' fairseq runs on purpose: fairseq's Adam decays
every parameter (biases, LayerNorm and embeddings included); we skip biases and LayerNorm
scales (`decay_mask`), as BERT's original optimizer did. `max_grad_norm=0` turns clipping
off, like fairseq's `--clip-norm 0` (RoBERTa's recipe).
"""

import jax
import optax

from maelm_jax.config.run_config import OptimizerConfig


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """0 -> learning_rate over warmup_steps, then linearly to 0 at num_train_steps."""
    warmup = max(1, min(config.warmup_steps, config.num_train_steps))
    decay = max(1, config.num_train_steps - warmup)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, config.learning_rate, warmup),
            optax.linear_schedule(config.learning_rate, 0.0, decay),
        ],
        [warmup],
    )


def decay_mask(params):
    """True where weight decay applies: every leaf except biases and LayerNorm scales
    (leaves named `bias`, `*_bias` or `scale`)."""

    def decays(path, _):
        name = str(getattr(path[-1], "key", path[-1]))
        return not (name.endswith("bias") or name == "scale")

    return jax.tree_util.tree_map_with_path(decays, params)


def create_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    clip = optax.identity()
    if config.max_grad_norm > 0:
        clip = optax.clip_by_global_norm(config.max_grad_norm)
    return optax.chain(
        clip,
        optax.adamw(
            learning_rate_schedule(config),
            b1=config.adam_b1,
            b2=config.adam_b2,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            mask=decay_mask,
        ),
    )
