"""Handing the accelerator from JAX to PyTorch inside one process (`study` on one host).

JAX's GPU client reserves 75% of the GPU's memory when it starts (its BFC allocator's
pool) and keeps the pool for the life of the client, freed buffers included: PyTorch,
fine-tuning in the same process after pretraining, got the other 25%. A pool is released
only when its client is destroyed, and a client only when nothing refers to it: no live
array, no compiled executable in a cache, no sharding in a `functools` cache (Orbax keeps
some, and so does `checkpoints/integrity.py`: found with a backreference search after a
tiny training run). So `to_cpu` deletes the arrays, clears those caches, JAX's and the
backends, checks that the clients are gone (weak references), and points
JAX at the CPU for the rest of the process, where the export's parity and the rank run in
float32 as the `export` and `analysis` commands do. It runs on CPU runs too, so the tests
walk the same path that frees a GPU.

The CPU is JAX's platform from the clear on, whether or not a client outlived it: a
backend started again would open the accelerator beside the client that leaked. And it is
for the rest of the process: training after a handover is refused (`check_not_handed_over`)
rather than run on the CPU without a word.
"""

import functools
import gc
import weakref

import jax
import jax.extend.backend
from absl import logging

from maelm_jax.config.run_config import ConfigError


def _clients() -> list:
    from jax._src import xla_bridge  # the live backend clients, by platform

    return list(xla_bridge._backends.values())


# Modules whose `functools` caches may key or hold shardings, and so the devices' client.
_CACHING_PACKAGES = ("orbax.", "maelm_jax.")


def _clear_library_caches() -> None:
    for obj in gc.get_objects():
        if isinstance(obj, functools._lru_cache_wrapper) and (
            getattr(obj, "__module__", None) or ""
        ).startswith(_CACHING_PACKAGES):
            obj.cache_clear()


# The platforms JAX released, once `to_cpu` has run in this process.
_released: list[str] | None = None


def check_not_handed_over(what: str) -> None:
    """Refuses `what` (JAX work the config sized for an accelerator) once this process has
    handed its accelerator to PyTorch; a CPU-only process lost nothing and goes on."""
    if _released and _released != ["cpu"]:
        raise ConfigError(
            f"{what}: this process handed JAX's {', '.join(_released)} devices to PyTorch "
            "(a study's fine-tuning), and JAX computes on the CPU from there; run it in a new "
            "process"
        )


def _collect_until_gone(refs: list, rounds: int = 4) -> list:
    """The clients still alive after up to `rounds` collections: one pass can leave a cycle
    that refers to a client for the next (jax.clear_backends itself collects four times)."""
    for _ in range(rounds):
        gc.collect()
        kept = [r() for r in refs if r() is not None]
        if not kept:
            return []
    return kept


def to_cpu() -> None:
    """Frees every JAX device buffer and client, then makes the CPU JAX's only platform.

    Raises ConfigError in a multi-process job (its clients are shared with the job's other
    processes until `jax.distributed.shutdown`) and RuntimeError if a client outlives the
    clear (something still holds an array or an executable: the accelerator stays held)."""
    from jax._src import distributed, xla_bridge

    global _released
    if distributed.global_state.client is not None:
        raise ConfigError("the accelerator is handed over only after the job's shutdown")
    if not xla_bridge.backends_are_initialized():  # nothing held (a resumed study)
        jax.config.update("jax_platforms", "cpu")
        _released = _released or []
        return
    platforms = sorted({d.platform for c in _clients() for d in c.devices()})
    for array in jax.live_arrays():
        array.delete()
    refs = [weakref.ref(c) for c in _clients()]
    _clear_library_caches()
    jax.clear_caches()
    jax.extend.backend.clear_backends()
    jax.config.update("jax_platforms", "cpu")  # from here on, even if a client leaked
    _released = platforms
    kept = _collect_until_gone(refs)
    if kept:
        raise RuntimeError(
            f"JAX's {', '.join(c.platform for c in kept)} client outlived clear_backends: "
            "something still holds one of its arrays or executables"
        )
    logging.info("JAX released its %s devices; it computes on the CPU from here", platforms)
