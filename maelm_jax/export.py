"""`python -m maelm_jax.export --workdir=DIR --output_dir=OUT [--step=N] [--json]`.

Writes a HuggingFace model directory from a checkpoint and proves it: the JAX encoder and
the reloaded PyTorch model agree on a padded batch, or the command fails and OUT does not
appear (`maelm_jax/hf/export.py` says which class and how).
"""

import dataclasses
import json

import jax
from absl import app, flags

from maelm_jax.config import cli
from maelm_jax.hf.export import export, format_result

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Called by `__main__` only: importing the module defines no flags."""
    flags.DEFINE_string("workdir", None, "Training workdir (local or gs://) holding checkpoints/.")
    flags.DEFINE_string(
        "output_dir",
        None,
        "New HuggingFace model directory (local, file:// or gs://).",
    )
    flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest usable).")
    flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")  # float32 parity on the host, like PyTorch's
    result = export(FLAGS.workdir, FLAGS.output_dir, FLAGS.step)
    print(json.dumps(dataclasses.asdict(result)) if FLAGS.json else format_result(result))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["workdir", "output_dir"])
    cli.run(main, errors=(RuntimeError,), prog="maelm_jax.export")
