"""`python -m maelm_jax.finetune --export=DIR | --workdir=DIR [--step=N] --output_dir=OUT
[--tasks=cola,sst2,...,squad_v2] [--glue_dir=DIR] [--squad_dir=DIR] [--quick]
[--compile=default] [--json]`.

Fine-tunes an export on GLUE and SQuAD in PyTorch (a GPU in bf16 when torch sees one) with
the papers' recipes and reports dev medians over seeds (`maelm_jax/finetuning/search.py` says
how runs are chosen, resumed and refused). `--workdir` exports the checkpoint first, through
the exporter and its parity check, into OUT/export-step<N>.
"""

import json
import os

from absl import app, flags, logging

from maelm_jax.config import cli
from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import recipe
from maelm_jax.glue import readers, tasks
from maelm_jax.squad import reading

FLAGS = flags.FLAGS
QUICK_DEV_QUESTIONS = 200  # --quick scores SQuAD's first dev questions, each one predicted
_RECIPE_FLAGS = {  # flag -> (type, an example); unset flags keep the chosen recipe's value
    "learning_rates": (float, "1e-5,2e-5,3e-5"),
    "batch_sizes": (int, "16,32"),
    "seeds": (int, "1,2,3"),
}


def define_flags() -> None:
    """Called by `__main__` only: importing the module defines no flags."""
    flags.DEFINE_string("export", None, "HuggingFace export (python -m maelm_jax.export).")
    flags.DEFINE_string("workdir", None, "Training workdir: export its checkpoint first.")
    flags.DEFINE_integer("step", None, "With --workdir: the checkpoint (default: newest usable).")
    flags.DEFINE_string("output_dir", None, "Folder for runs/ and results.json (resumable).")
    flags.DEFINE_string(
        "tasks", ",".join(tasks.TASKS), "GLUE tasks and/or squad_v2, squad_v1, comma-separated."
    )
    flags.DEFINE_string("glue_dir", None, "GLUE's download (CoLA/train.tsv, ...); else TFDS.")
    flags.DEFINE_string("squad_dir", None, "SQuAD's files (train-v2.0.json, ...); else TFDS.")
    flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir for glue/, squad/ (default TFDS's).")
    flags.DEFINE_list("inits", ["pretrained"], "pretrained and/or random (the control row).")
    flags.DEFINE_bool("quick", False, "A CPU smoke budget (recipe.py QUICK), not a result.")
    flags.DEFINE_list("learning_rates", None, "Grid of peak learning rates.")
    flags.DEFINE_list("batch_sizes", None, "Grid of batch sizes.")
    flags.DEFINE_list("seeds", None, "Seeds of every setting (the median is reported).")
    flags.DEFINE_float("epochs", None, "Epochs over the (capped) train set.")
    flags.DEFINE_integer("max_steps", None, "Cap on each run's steps (0: none).")
    flags.DEFINE_integer("max_train_examples", None, "Train subset per run (0: all).")
    flags.DEFINE_integer(
        "max_seq_length", None, "Tokens per row, cut longest first; SQuAD's window length."
    )
    flags.DEFINE_integer("doc_stride", None, "SQuAD: tokens between windows (default 128, scaled).")
    flags.DEFINE_float("warmup_ratio", None, "Share of steps warming up linearly.")
    flags.DEFINE_float("weight_decay", None, "AdamW's decoupled weight decay.")
    flags.DEFINE_float("dropout", None, "Hidden and classifier dropout while fine-tuning.")
    flags.DEFINE_float("attention_dropout", None, "Attention dropout while fine-tuning.")
    flags.DEFINE_enum(
        "compile", "none", ["none", "default", "reduce-overhead"],
        "torch.compile the model with this mode (reduce-overhead adds CUDA graphs), once per "
        "task, widths rounded to a few buckets: pays on a GPU over runs of thousands of steps; "
        "eager again if compiling fails.",
    )  # fmt: skip
    flags.DEFINE_bool("json", False, "Print results.json's content instead of the table.")


def chosen_recipe(family: str = "glue") -> recipe.Recipe:
    """The family's recipe (or --quick's), with every recipe flag given on top: a flag sets
    its value for every family fine-tuned."""
    base = recipe.RECIPES[family][1 if FLAGS.quick else 0]
    changes = {}
    for name, (kind, example) in _RECIPE_FLAGS.items():
        values = FLAGS[name].value
        if values is not None:
            try:
                changes[name] = tuple(kind(v) for v in values)
            except ValueError:
                what = "integers" if kind is int else "numbers"
                raise ConfigError(
                    f"--{name}={','.join(values)}: give {what}, comma-separated "
                    f"(e.g. --{name}={example})"
                ) from None
    for name in (
        "epochs", "max_steps", "max_train_examples", "max_seq_length", "warmup_ratio",
        "weight_decay", "dropout", "attention_dropout",
    ):  # fmt: skip
        if FLAGS[name].value is not None:
            changes[name] = FLAGS[name].value
    return recipe.Recipe(**{**vars(base), **changes})


def task_list() -> list:
    """--tasks, in order: GLUE's tasks and SQuAD's (squad_runs.SquadTask, with its recipe)."""
    from maelm_jax.finetuning.squad_runs import SquadTask

    names = [n.strip() for n in FLAGS.tasks.split(",") if n.strip()]
    allowed = f"{', '.join(tasks.TASKS)}, {', '.join(reading.VERSIONS)}"
    if not names:
        raise ConfigError(f"--tasks: no task given; allowed: {allowed}")
    chosen = []
    for name in names:
        key = name.lower()
        if key in reading.VERSIONS:
            chosen.append(
                SquadTask(
                    reading.VERSIONS[key],
                    chosen_recipe("squad"),
                    squad_dir=FLAGS.squad_dir,
                    tfds_data_dir=FLAGS.tfds_data_dir,
                    max_seq_length=FLAGS.max_seq_length,
                    doc_stride=FLAGS.doc_stride,
                    max_dev_questions=QUICK_DEV_QUESTIONS if FLAGS.quick else 0,
                )
            )
        elif key.replace("-", "") in tasks.TASKS:
            chosen += tasks.resolve([name])
        else:
            raise ConfigError(
                f"--tasks: unknown task {name!r}; allowed: {allowed} (WNLI is left out, as the "
                "papers leave it out)"
            )
    if FLAGS.squad_dir is not None and not any(c.name in reading.VERSIONS for c in chosen):
        raise app.UsageError("--squad_dir goes with --tasks=squad_v2 or squad_v1")
    if FLAGS.doc_stride is not None and FLAGS.doc_stride < 1:
        raise ConfigError(f"--doc_stride={FLAGS.doc_stride}: must be >= 1")
    return list({c.name: c for c in chosen}.values())


def export_dir(output_dir: str) -> str:
    """--export, or --workdir's checkpoint exported once into OUT/export-step<N>."""
    if (FLAGS.export is None) == (FLAGS.workdir is None):
        raise app.UsageError("give exactly one of --export and --workdir")
    if FLAGS.export is not None:
        if FLAGS.step is not None:
            raise app.UsageError("--step goes with --workdir, not --export")
        return FLAGS.export
    from maelm_jax.hf.export import export
    from maelm_jax.inspection import trained_model

    step = int(trained_model.step_dir_of(FLAGS.workdir, FLAGS.step).name)
    out = os.path.join(output_dir, f"export-step{step}")
    if not os.path.isfile(os.path.join(out, "config.json")):
        logging.info("exporting %s step %d to %s", FLAGS.workdir, step, out)
        export(FLAGS.workdir, out, step)  # appears only once parity holds
    return out


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import jax

    cli.quiet_library_logs()  # Orbax narrates every step at INFO

    jax.config.update("jax_platforms", "cpu")  # the export's parity check runs on the host
    chosen = chosen_recipe()
    asked = task_list()
    from maelm_jax.finetuning.model_slot import LoopOptions
    from maelm_jax.finetuning.report import table
    from maelm_jax.finetuning.search import run_search

    compiled = FLAGS.compile != "none"
    options = LoopOptions(compile=compiled, compile_mode=FLAGS.compile if compiled else "default")

    result = run_search(
        export_dir(FLAGS.output_dir),
        asked,
        chosen,
        FLAGS.output_dir,
        inits=tuple(FLAGS.inits),
        glue_dir=FLAGS.glue_dir,
        tfds_data_dir=FLAGS.tfds_data_dir,
        options=options,
    )
    print(json.dumps(result) if FLAGS.json else table(result))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["output_dir"])
    cli.run(
        main,
        errors=(readers.GlueDataError, reading.SquadDataError, RuntimeError),
        prog="maelm_jax.finetune",
    )
