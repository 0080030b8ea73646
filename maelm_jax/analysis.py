"""`python -m maelm_jax.analysis --workdir=DIR --output_dir=OUT [--num_tokens=N] [--step=N]
[--text_file=F] [--json]`: the rank of a checkpoint's representations, layer by layer,
written to OUT as rank.json and rank.png (`maelm_jax/inspection/representation_rank.py`
says what is measured).
"""

import json
import sys

import jax
from absl import app, flags

from maelm_jax.config.run_config import ConfigError
from maelm_jax.inspection.representation_rank import run

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Called by `__main__` only: importing the module defines no flags."""
    flags.DEFINE_string("workdir", None, "Training workdir (local or gs://) holding checkpoints/.")
    flags.DEFINE_string("output_dir", None, "Directory for rank.json and rank.png.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest usable).")
    flags.DEFINE_integer(
        "num_tokens", 8192, "Real tokens measured per condition (bounds the work)."
    )
    flags.DEFINE_string("text_file", None, "Held-out text instead of the run's eval split.")
    flags.DEFINE_string(
        "dataset",
        None,
        "The eval split of this dataset instead of the one stored with the checkpoint (the "
        "same corpus at another path).",
    )
    flags.DEFINE_bool("json", False, "Print rank.json's content instead of the table.")


def _table(result: dict) -> str:
    conds = result["conditions"]
    lines = ["layer " + " ".join(f"{c + ' pca90/entropy':>28}" for c in conds)]
    for i, layer in enumerate(result["layers"]):
        cells = [f"{v['pca90'][i]} / {v['entropy'][i]:.2f}" for v in conds.values()]
        lines.append(f"{layer:>5} " + " ".join(f"{x:>28}" for x in cells))
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")
    try:
        result = run(
            FLAGS.workdir,
            FLAGS.output_dir,
            FLAGS.step,
            FLAGS.num_tokens,
            FLAGS.text_file,
            FLAGS.dataset,
        )
    except ConfigError as e:
        sys.exit(f"maelm_jax.analysis: error: {e}")
    print(json.dumps(result) if FLAGS.json else _table(result))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["workdir", "output_dir"])
    app.run(main)
