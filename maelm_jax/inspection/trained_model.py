"""A finished run as export and analysis see it: one checkpoint's config, tokenizer and params.

Only the parameters are restored (an Orbax partial restore of `state.params`): the optimizer
state, twice the parameters' size, is never read, so a base model exports on a laptop.

What is read back is the model, not how the run computed it: the kernels a run trained with
(cuDNN or splash attention, the Triton bias) exist on some platforms only, and the same
attention computed by XLA is what export, analysis and fine-tuning rebuild anywhere. Its
functions run at full float32 matmul precision wherever they run: JAX's default on a GPU is
TF32 and on a TPU one bf16 pass, and the export's parity against PyTorch's float32 (1e-4)
and the rank must not depend on the device that computed them.
"""

import base64
import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from maelm_jax.checkpoints import manifest
from maelm_jax.checkpoints.params import load_params
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError, ModelConfig, RunConfig
from maelm_jax.data.tokenizer import MASK_ID, Tokenizer
from maelm_jax.model.masked_lm import MaskedLM, init_inputs

# The platform-neutral way to compute each kernel setting (what "auto" computes off-device).
PORTABLE_KERNELS = {
    "attention_impl": "xla",
    "attention_dropout_impl": "xla",
    "relative_bias_impl": "dense",
}


class FullPrecisionJit:
    """`jax.jit(fn)` traced under `jax.default_matmul_precision("highest")`: every matmul
    in full float32, the precision PyTorch's CPU float32 computes in."""

    def __init__(self, fn):
        self._jitted = jax.jit(fn)

    def __call__(self, *args):
        with jax.default_matmul_precision("highest"):
            return self._jitted(*args)

    def lower(self, *args):
        with jax.default_matmul_precision("highest"):
            return self._jitted.lower(*args)


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """`model_config` computes in float32 whatever the run trained in: an export is float32."""

    config: RunConfig  # as the checkpoint stored it, completed with today's defaults
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
        run = FullPrecisionJit(
            lambda p, ids, pos: model.apply({"params": p}, ids, pos, method=MaskedLM.encode)
        )
        return lambda ids, pos: run(self.params, ids, pos)


def _choose_step(root: epath.Path, step: int | None) -> epath.Path:
    steps = sorted((int(p.name) for p in root.glob("*") if p.name.isdigit()), reverse=True)
    usable = [s for s in steps if manifest.problem_with(root / str(s)) is None]
    if step is None:
        if not usable:
            raise ConfigError(f"{os.fspath(root)} holds no usable checkpoint (steps: {steps})")
        return root / str(usable[0])
    if step not in usable:
        problem = manifest.problem_with(root / str(step)) if step in steps else "no such step"
        raise ConfigError(f"step={step} cannot be read ({problem}); usable steps: {usable}")
    return root / str(step)


def abstract_params(model_config: ModelConfig, pad_id: int, seq_len: int, k: int):
    """ShapeDtypeStructs of the parameters `model_config` creates, on this host's CPU (the
    first device where the process has no CPU backend, as under JAX_PLATFORMS=cuda)."""
    model = MaskedLM(model_config, pad_id=pad_id, mask_id=MASK_ID)
    boxed = jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), *init_inputs(seq_len, k))["params"]
    )
    host = jax.sharding.SingleDeviceSharding(host_device())
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host), nn.meta.unbox(boxed)
    )


def host_device() -> jax.Device:
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # "Backend 'cpu' is not in the list of known backends"
        return jax.local_devices()[0]


def step_dir_of(workdir, step: int | None = None) -> epath.Path:
    """The newest usable checkpoint's folder in `workdir`, or `step`'s; ConfigError if none."""
    root = manifest.absolute(workdir) / manifest.CHECKPOINT_DIRNAME
    if not root.exists():
        raise ConfigError(f"workdir={os.fspath(workdir)!r} has no {root.name}/ directory")
    return _choose_step(root, step)


def load(workdir, step: int | None = None) -> TrainedModel:
    """The newest usable checkpoint of `workdir` (local or gs://), or `step`; ConfigError if
    there is none or its parameters do not fit the config stored beside them."""
    step_dir = step_dir_of(workdir, step)
    handler = ocp.JsonCheckpointHandler()
    config = configdict.from_checkpoint(
        handler.restore(step_dir / "config", args=ocp.args.JsonRestore())
    )
    tok_json = handler.restore(step_dir / "tokenizer", args=ocp.args.JsonRestore())
    tokenizer = Tokenizer(base64.b64decode(tok_json["sentencepiece_model_base64"]))
    model_config = dataclasses.replace(
        config.model.for_vocab(tokenizer.vocab_size), dtype=jnp.float32, **PORTABLE_KERNELS
    )
    k = config.masking.num_masked
    target = abstract_params(model_config, tokenizer.pad_id, config.seq_len, k)
    params = load_params(os.fspath(step_dir), target)
    params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
    return TrainedModel(config, model_config, tokenizer, params, int(step_dir.name), step_dir)
