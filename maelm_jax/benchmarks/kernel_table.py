"""`python -m maelm_jax.bench kernels` on a GPU machine without TensorFlow: jax_speed's
stand-ins first, then the command with the flags given (bench's own, which it checks).

Usage (from the checkout's root): python -m maelm_jax.benchmarks.kernel_table --configs=...
[bench kernels flags]"""

import runpy
import sys

from maelm_jax.benchmarks import jax_speed


def main(flags: list[str]) -> None:
    jax_speed.stand_in_missing_modules()
    sys.argv = ["maelm_jax.bench", "kernels", *flags]
    runpy.run_module("maelm_jax.bench", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
