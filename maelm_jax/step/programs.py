"""A config on a mesh -> the sharded, jitted programs: init, train step, eval step.

Training, ahead-of-time compilation for a TPU topology and checkpoint restore all start
from the same `Programs`, so what `maelm_jax.compile` measures is what `main` runs.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from maelm_jax.config.run_config import MaskingConfig, ModelConfig, RunConfig, dropout_rng_impl_for
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID
from maelm_jax.hardware import platforms
from maelm_jax.model.kernels.cudnn import COMPILER_OPTIONS
from maelm_jax.model.masked_lm import MaskedLM
from maelm_jax.step import optimizer, sharding, train_state, train_step


@dataclasses.dataclass(frozen=True)
class Programs:
    mesh: Mesh
    rules: tuple
    model: MaskedLM
    model_cfg: ModelConfig
    masking_cfg: MaskingConfig
    tx: optax.GradientTransformation
    init_fn: Any  # rng -> boxed TrainState
    boxed_state: train_state.TrainState  # abstract: shapes + logical axes
    state_shardings: train_state.TrainState  # NamedSharding per leaf
    batch_sharding: NamedSharding
    train_step: Any  # jitted (state, batch) -> (state, metrics); donates state
    eval_step: Any  # jitted (params, batch, index) -> sums

    def abstract_state(self) -> train_state.TrainState:
        """ShapeDtypeStructs with shardings, for AOT lowering and checkpoint restore; call it
        outside `sharding.activate` (works inside too, but needs no mesh)."""
        return train_state.sharded_shapes(self.boxed_state, self.state_shardings)

    def abstract_batch(self, batch_size: int, seq_len: int) -> dict:
        shape = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32, sharding=self.batch_sharding)
        return {"input_ids": shape}

    def global_batch(self, local_rows) -> dict:
        """This process's rows -> one global array sharded over the mesh's batch axes."""
        array = jax.make_array_from_process_local_data(self.batch_sharding, local_rows)
        return {"input_ids": array}

    def initialize(self, rng: jax.Array) -> train_state.TrainState:
        with sharding.activate(self.mesh, self.rules):
            return train_state.initialize(self.init_fn, rng, self.state_shardings)


def model_and_masking(
    run: RunConfig, vocab_size: int, platform: str | None = None, embed_shards: int = 1
) -> tuple[MaskedLM, MaskingConfig]:
    """The model and its masking for a tokenizer of `vocab_size` pieces (the project's fixed
    special-id layout), with its attention kernels chosen for `platform`'s devices (None:
    the XLA path everywhere) and its token lookup for an embedding axis split
    `embed_shards` ways."""
    masking_cfg = run.masking.for_tokenizer(
        vocab_size=vocab_size,
        mask_id=MASK_ID,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        special_ids=(BOS_ID, PAD_ID, EOS_ID),
        first_regular_id=FIRST_REGULAR_ID,
    )
    model_cfg = run.model.for_vocab(vocab_size).for_embedding_shards(embed_shards)
    if platform is not None:
        model_cfg = model_cfg.for_platform(platform)
    return MaskedLM(model_cfg, pad_id=PAD_ID, mask_id=MASK_ID), masking_cfg


def build(run: RunConfig, mesh: Mesh, vocab_size: int) -> Programs:
    """Everything a run needs before data arrives; checks the run against the mesh.

    `vocab_size` is the tokenizer's (unpadded) size: it bounds random MLM replacements,
    and its multiple-of-128 padding sizes the embedding.
    """
    rules = sharding.axis_rules(run.mesh)
    sharding.check_batch(run, mesh, rules)
    platform = platforms.kernel_platform(mesh.devices.flat[0])
    embed_shards = sharding.num_shards(mesh, rules, "embed")
    model, masking_cfg = model_and_masking(run, vocab_size, platform, embed_shards)
    model_cfg = model.config
    cudnn_dropout = model_cfg.attention_dropout_impl == "cudnn"
    tx = optimizer.create_optimizer(run.optimizer)
    init_fn = train_state.make_init_fn(model, tx, model_cfg, run.seq_len, masking_cfg.num_masked)
    with sharding.activate(mesh, rules):
        boxed = train_state.abstract_state(init_fn)
    specs = train_state.logical_specs(boxed)
    sharding.check_divisible(specs.params, nn.meta.unbox(boxed.params), mesh, rules)
    state_shardings = sharding.shardings(specs, mesh, rules)
    batch_sharding = sharding.batch_sharding(mesh, rules)
    batch_shardings = {"input_ids": batch_sharding}
    replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())

    step = functools.partial(
        train_step.train_step,
        model=model,
        tx=tx,
        schedule=optimizer.learning_rate_schedule(run.optimizer),
        masking_cfg=masking_cfg,
        seed=run.seed,
        grad_accum_steps=run.loop.grad_accum_steps,
        inject_nan_at_step=run.loop.inject_nan_at_step,
        dropout_rng_impl=dropout_rng_impl_for(run.loop.dropout_rng_impl, platform),
    )
    evaluate = functools.partial(
        train_step.eval_step, model=model, masking_cfg=masking_cfg, seed=run.seed
    )
    return Programs(
        mesh=mesh,
        rules=rules,
        model=model,
        model_cfg=model_cfg,
        masking_cfg=masking_cfg,
        tx=tx,
        init_fn=init_fn,
        boxed_state=boxed,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding,
        train_step=jax.jit(
            step,
            in_shardings=(state_shardings, batch_shardings),
            out_shardings=(state_shardings, replicated),
            donate_argnums=0,
            # cuDNN's dropout cannot be recorded into a command buffer (kernels/cudnn.py)
            compiler_options=COMPILER_OPTIONS if cudnn_dropout else None,
        ),
        eval_step=jax.jit(
            evaluate,
            in_shardings=(state_shardings.params, batch_shardings, replicated),
            out_shardings=replicated,
        ),
    )
