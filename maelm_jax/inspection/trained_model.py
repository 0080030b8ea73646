"""A finished run as export and analysis see it: one checkpoint's config, tokenizer and params.

Only the parameters are restored (an Orbax partial restore of `state.params`): the optimizer
state, twice the parameters' size, is never read, so a base model exports on a laptop.
"""

import base64
import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from maelm_jax import configuration
from maelm_jax.checkpoints import checkpointing
from maelm_jax.configuration import ConfigError, ModelConfig
from maelm_jax.data.tokenizer import MASK_ID, Tokenizer
from maelm_jax.model.masked_lm import MaskedLM, init_inputs


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """`model_config` computes in float32 whatever the run trained in: an export is float32."""

    config: ml_collections.ConfigDict
    model_config: ModelConfig
    tokenizer: Tokenizer
    params: dict  # numpy float32 leaves, the layout `MaskedLM` creates
    step: int
    step_dir: epath.Path

    @property
    def model(self) -> MaskedLM:
        return MaskedLM(self.model_config, pad_id=self.tokenizer.pad_id, mask_id=MASK_ID)

    def encode_fn(self):
        """(input_ids, positions) [B, T] -> final hidden states [B, T, E], float32, jitted."""
        model = self.model
        run = jax.jit(
            lambda p, ids, pos: model.apply({"params": p}, ids, pos, method=MaskedLM.encode)
        )
        return lambda ids, pos: run(self.params, ids, pos)


def _choose_step(root: epath.Path, step: int | None) -> epath.Path:
    steps = sorted((int(p.name) for p in root.glob("*") if p.name.isdigit()), reverse=True)
    usable = [s for s in steps if checkpointing.problem_with(root / str(s)) is None]
    if step is None:
        if not usable:
            raise ConfigError(f"{os.fspath(root)} holds no usable checkpoint (steps: {steps})")
        return root / str(usable[0])
    if step not in usable:
        problem = checkpointing.problem_with(root / str(step)) if step in steps else "no such step"
        raise ConfigError(f"step={step} cannot be read ({problem}); usable steps: {usable}")
    return root / str(step)


# What the model did before each of these keys existed, for checkpoints written before it.
_BEFORE_KEY_EXISTED = {
    "attention_dropout_rate": 0.0,
    "decoder_attention_dropout_rate": 0.0,
    "mask_token_source": "learned",
}


def _with_defaults(saved: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A checkpoint's config completed for keys added since it was written: model keys get
    what the model did before (`_BEFORE_KEY_EXISTED`; any other missing model key is a
    ConfigError), top-level keys (training-only: data, optimizer, logging) their defaults."""
    from configs import base

    defaults = base.get_config()
    absent = [k for k in defaults.model if k not in saved.model]
    unknown = [k for k in absent if k not in _BEFORE_KEY_EXISTED]
    if unknown:
        raise ConfigError(f"the checkpoint's config lacks model keys {unknown}")
    for key in absent:
        saved.model[key] = _BEFORE_KEY_EXISTED[key]
    if absent:
        logging.warning("Checkpoint config predates model keys %s; using what runs did", absent)
    for key in defaults:
        if key not in saved:
            saved[key] = defaults[key]
    return saved


def abstract_params(model_config: ModelConfig, pad_id: int, seq_len: int, k: int):
    """ShapeDtypeStructs of the parameters `model_config` creates, on this host's CPU."""
    model = MaskedLM(model_config, pad_id=pad_id, mask_id=MASK_ID)
    boxed = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), *init_inputs(seq_len, k))["params"]
    )
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), nn.meta.unbox(boxed)
    )


def load(workdir, step: int | None = None) -> TrainedModel:
    """The newest usable checkpoint of `workdir` (local or gs://), or `step`; ConfigError if
    there is none or its parameters do not fit the config stored beside them."""
    root = checkpointing.absolute(workdir) / checkpointing.CHECKPOINT_DIRNAME
    if not root.exists():
        raise ConfigError(f"workdir={os.fspath(workdir)!r} has no {root.name}/ directory")
    step_dir = _choose_step(root, step)
    handler = ocp.JsonCheckpointHandler()
    config = _with_defaults(
        ml_collections.ConfigDict(handler.restore(step_dir / "config", args=ocp.args.JsonRestore()))
    )
    tok_json = handler.restore(step_dir / "tokenizer", args=ocp.args.JsonRestore())
    tokenizer = Tokenizer(base64.b64decode(tok_json["sentencepiece_model_base64"]))
    model_config = dataclasses.replace(
        configuration.model_config(config, tokenizer.vocab_size), dtype=jnp.float32
    )
    k = configuration.num_masked(config.mask_rate, config.seq_len)
    target = abstract_params(model_config, tokenizer.pad_id, config.seq_len, k)
    params = checkpointing.load_params(os.fspath(step_dir), target)
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    return TrainedModel(config, model_config, tokenizer, params, int(step_dir.name), step_dir)
