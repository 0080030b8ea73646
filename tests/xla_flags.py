"""The XLA flags of every test process (pytest's and the processes the tests start).

Tiny test programs spend far longer in LLVM than running: level 0 halves compile time, and
on jaxlib before 0.12 the classic fusion emitters (not the MLIR ones) more than halve what
is left (a sharded train step: 21.5 s -> 9.2 s of compiles, the same loss). jaxlib 0.12
dropped that flag, and XLA aborts on a flag it does not know, so it is asked for only where
it exists. Read from the installed package's metadata: jax must not be imported before the
flags are set.
"""

import importlib.metadata


def _jaxlib_before(major: int, minor: int) -> bool:
    version = importlib.metadata.version("jaxlib").split(".")
    return (int(version[0]), int(version[1])) < (major, minor)


FAST_COMPILE = " ".join(
    [
        "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true",
        *(["--xla_cpu_use_fusion_emitters=false"] if _jaxlib_before(0, 12) else []),
    ]
)
