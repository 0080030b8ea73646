"""`python -m maelm_jax.bench kernels` on a GPU machine without TensorFlow: jax_speed.py's
stand-ins first, then the command with the flags given.

Usage: python kernel_table.py PROJ OUTDIR --configs=... [bench flags]"""

import pathlib
import runpy
import sys

proj, out, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = [sys.argv[0], proj, out]  # jax_speed.py with no groups: stand-ins and imports only
runpy.run_path(str(pathlib.Path(__file__).with_name("jax_speed.py")))
sys.argv = ["maelm_jax.bench", "kernels", *flags]
runpy.run_module("maelm_jax.bench", run_name="__main__")
