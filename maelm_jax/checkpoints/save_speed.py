"""How long a checkpoint of a state the size of a config's takes to save and restore on this
machine (`python -m maelm_jax.bench checkpoint`): the blocking part of a save (until
training could go on), the total (until the step is committed), the integrity record's
share, the size on disk, and a verified restore.
"""

import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp

from maelm_jax.checkpoints import checkpointing, manifest
from maelm_jax.checkpoints import integrity as checkpoint_integrity
from maelm_jax.config.run_config import RunConfig
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.tokenizer import Tokenizer
from maelm_jax.model.masked_lm import count_params
from maelm_jax.step import programs, sharding


def measure(config: RunConfig) -> dict:
    """Seconds and bytes of one save and one restore of `config`'s state."""
    mesh = sharding.create_mesh(config.mesh)
    progs = programs.build(config, mesh, config.data.vocab_size)
    state = _incompressible(progs.initialize(jax.random.PRNGKey(0)), progs.state_shardings)
    params = count_params(state.params)
    with tempfile.TemporaryDirectory() as workdir:
        tokenizer = _bench_tokenizer()
        checkpointer = checkpointing.Checkpointer(config, workdir, tokenizer)
        checkpoint_integrity.record(state)  # compiled once, as a run's first save does
        start = time.perf_counter()
        checkpoint_integrity.record(state)
        record = time.perf_counter() - start
        start = time.perf_counter()
        checkpointer.save(1, state, {"step": 1}, force=True)
        blocking = time.perf_counter() - start
        checkpointer.wait_until_finished()
        total = time.perf_counter() - start
        step_dir = pathlib.Path(workdir) / manifest.CHECKPOINT_DIRNAME / "1"
        size = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
        start = time.perf_counter()
        with sharding.activate(progs.mesh, progs.rules):
            restored, _ = checkpointer.restore_latest(progs.abstract_state())
        restore = time.perf_counter() - start
        start = time.perf_counter()
        checkpoint_integrity.record(restored)
        verify = time.perf_counter() - start
        checkpointer.close()
    return {
        "params": params,
        "bytes": size,
        "save_blocking_s": blocking,
        "save_total_s": total,
        "record_s": record,
        "restore_s": restore,
        "verify_s": verify,
    }


def format_result(name: str, r: dict) -> str:
    return (
        f"{name}: {r['params']:,} params + Adam state, {r['bytes'] / 1e9:.2f} GB on disk: save "
        f"blocks {r['save_blocking_s']:.2f}s, committed after {r['save_total_s']:.2f}s "
        f"({r['bytes'] / 1e6 / r['save_total_s']:.0f} MB/s); integrity record "
        f"{r['record_s']:.2f}s of the blocking save; restore {r['restore_s']:.2f}s, of which "
        f"verifying the record {r['verify_s']:.2f}s"
    )


def _incompressible(state, shardings):
    """Random values in every float leaf, in place of a fresh state's zero Adam moments,
    which would compress away and make the save look cheaper than a trained run's."""

    def randomize(state):
        leaves, treedef = jax.tree_util.tree_flatten(state)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
        noisy = [
            jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
            for k, x in zip(keys, leaves, strict=True)
        ]
        return jax.tree_util.tree_unflatten(treedef, noisy)

    return jax.block_until_ready(jax.jit(randomize, out_shardings=shardings)(state))


def _bench_tokenizer() -> Tokenizer:
    """Any valid tokenizer: a checkpoint carries one, its content does not matter here."""
    text = [f"The quick brown fox jumps over the lazy dog number {i}." for i in range(200)]
    return Tokenizer(tokenizer_lib.train(text, 300))
