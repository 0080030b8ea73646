"""`python -m maelm_jax.study --study_dir=DIR [--preset=cpu|gpu] [--configs=a.py,b.py,...]
[--tasks=...] [--glue_dir=DIR] [--squad_dir=DIR] [--json]`: the papers' comparison in one
resumable command.

Each config (an objective) is pretrained through the ordinary training path, exported,
fine-tuned on GLUE (and SQuAD where `--tasks` names squad_v2 or squad_v1) and measured (the
last layer's effective rank), and the first config's architecture is fine-tuned again from
random init, the row that says whether pretraining helped. `--preset` picks the defaults of
the configs and the fine-tuning flags: `cpu` (configs/study/), a scale a 2-core CPU runs in
about an hour, or `gpu` (configs/study/gpu_scale/), MLM, MAE-LM and random init in 9 minutes
on one H200 (`studies/presets.py`). The paper configs work unchanged, on one host or on a pod, where
every host runs the same command in one shared folder: every host pretrains, process 0 does
the rest (`studies/hosts.py`). `maelm_jax/studies/` holds the stages and report.
"""

import json
import os

from absl import app, flags, logging

from maelm_jax.config import cli
from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import recipe
from maelm_jax.glue import readers
from maelm_jax.hardware import distributed
from maelm_jax.squad import reading
from maelm_jax.studies import presets

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Called by `__main__` only: importing the module defines no flags. The defaults are
    the cpu preset's; `presets.apply` replaces those a user did not give."""
    cpu, fv = presets.PRESETS[presets.DEFAULT], {"flag_values": flag_values}
    flags.DEFINE_string("study_dir", None, "Folder of the study (resumable; one spec).", **fv)
    flags.DEFINE_string(
        "preset",
        presets.DEFAULT,
        f"Defaults for the flags not given: {' or '.join(presets.PRESETS)} "
        "(maelm_jax/studies/presets.py).",
        **fv,
    )
    flags.DEFINE_bool(
        presets.ALLOW_SLOW_FLAG,
        False,
        "Run --preset=gpu even where JAX would run on the CPU alone (more than a day).",
        **fv,
    )
    flags.DEFINE_list("configs", cpu["configs"], "Config files, one objective each.", **fv)
    flags.DEFINE_list(
        "overrides", [], "key=value applied to every config (e.g. num_train_steps=800).", **fv
    )
    flags.DEFINE_string(
        "tasks", cpu["tasks"], "GLUE tasks and/or squad_v2, squad_v1, comma-separated.", **fv
    )
    flags.DEFINE_string("glue_dir", None, "GLUE's download (CoLA/train.tsv, ...); else TFDS.", **fv)
    flags.DEFINE_string("squad_dir", None, "SQuAD's files (train-v2.0.json, ...); else TFDS.", **fv)
    flags.DEFINE_list("seeds", cpu["seeds"], "Fine-tuning seeds (the median is reported).", **fv)
    flags.DEFINE_list("learning_rates", cpu["learning_rates"], "Fine-tuning learning rates.", **fv)
    flags.DEFINE_list("batch_sizes", cpu["batch_sizes"], "Fine-tuning batch sizes.", **fv)
    flags.DEFINE_float("epochs", cpu["epochs"], "Fine-tuning epochs.", **fv)
    flags.DEFINE_integer(
        "max_steps", cpu["max_steps"], "Cap on each fine-tuning run's steps (0: none).", **fv
    )
    flags.DEFINE_integer(
        "max_seq_length", cpu["max_seq_length"], "Fine-tuning tokens per row.", **fv
    )
    flags.DEFINE_integer("rank_tokens", 4096, "Tokens for the effective rank.", **fv)
    flags.DEFINE_string(
        "workdir_root",
        None,
        "Where each objective pretrains: <root>/<objective> (local or gs://; on a pod a "
        "bucket, where Orbax writes natively). Default: <study_dir>/<objective>/workdir.",
        **fv,
    )
    flags.DEFINE_string(
        "cluster_detection",
        distributed.cluster_detection_default(),
        "How a study on several hosts finds its peers without --coordinator_address: 'auto', "
        f"'none' or a JAX detector's name such as 'mpi4py' (${distributed.CLUSTER_ENV_VAR}).",
        **fv,
    )
    flags.DEFINE_bool("json", False, "Print results.json's table instead of the markdown.", **fv)
    flags.DEFINE_string(
        "coordinator_address", None, "host:port of process 0 (manual multi-process).", **fv
    )
    flags.DEFINE_integer("num_processes", None, "Number of processes (manual multi-process).", **fv)
    flags.DEFINE_integer("process_id", None, "This process's index (manual multi-process).", **fv)
    flags.DEFINE_string(
        "cpu_collectives",
        "gloo",
        "CPU collectives for multi-process CPU runs ('gloo' or 'mpi').",
        **fv,
    )


def _overrides() -> dict:
    out = {}
    for item in FLAGS.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(
                f"--overrides: {item!r} is not key=value (e.g. --overrides=num_train_steps=800,"
                "batch_size=8)"
            )
        out[key.strip()] = value.strip()
    return out


def _numbers(name: str, kind: type, example: str) -> tuple:
    values = getattr(FLAGS, name)
    try:
        return tuple(kind(v) for v in values)
    except ValueError:
        what = "integers" if kind is int else "numbers"
        raise ConfigError(
            f"--{name}={','.join(values)}: give {what}, comma-separated (e.g. --{name}={example})"
        ) from None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from maelm_jax.studies import plan

    plan.check_study_dir(FLAGS.study_dir)
    presets.apply(FLAGS)
    presets.check_machine(FLAGS)
    cli.quiet_library_logs()  # Orbax narrates every step at INFO
    from maelm_jax.hardware import platforms

    platforms.skip_absent_tpu()

    finetune_recipe = recipe.Recipe(
        learning_rates=_numbers("learning_rates", float, "2e-5,3e-5"),
        batch_sizes=_numbers("batch_sizes", int, "16,32"),
        seeds=_numbers("seeds", int, "1,2,3"),
        epochs=FLAGS.epochs,
        max_steps=FLAGS.max_steps,
        max_seq_length=FLAGS.max_seq_length,
    )
    configs = {}
    for path in FLAGS.configs:
        name = os.path.splitext(os.path.basename(path))[0]
        if name in configs:
            raise ConfigError(f"--configs: two configs named {name!r}; give distinct file names")
        configs[name] = cli.load_config_file(path, flag="configs")
    study = plan.Study(
        configs=plan.with_overrides(configs, _overrides()),
        tasks=plan.resolve_tasks(FLAGS.tasks, finetune_recipe, FLAGS.squad_dir),
        recipe=finetune_recipe,
        glue_dir=FLAGS.glue_dir,
        squad_dir=FLAGS.squad_dir,
        rank_tokens=FLAGS.rank_tokens,
        workdir_root=plan.workdir_root(FLAGS.workdir_root),
    )
    distributed.initialize(
        FLAGS.coordinator_address,
        FLAGS.num_processes,
        FLAGS.process_id,
        FLAGS.cpu_collectives,
        FLAGS.cluster_detection,
    )
    from maelm_jax.hardware import multihost
    from maelm_jax.training import preemption

    try:
        _run(study)
    except (preemption.Preempted, preemption.Interrupted) as e:
        # Saved, and no later stage started: a status that says so, as `main`'s 130 does
        # for Ctrl-C, so a supervisor reruns it rather than read a finished study.
        multihost.leave_together()
        interrupted = isinstance(e, preemption.Interrupted)
        status = preemption.EXIT_INTERRUPTED if interrupted else preemption.EXIT_PREEMPTED
        cli.exit_now(status, str(e), prog="maelm_jax.study")
    except BaseException:
        multihost.leave_together()  # process 0 hosts the job: it leaves last
        raise


def _run(study) -> None:
    from maelm_jax.studies import hosts, plan, report, stages

    # Bad or missing data is refused before pretraining; process 0 alone fine-tunes, so it
    # alone reads (or downloads) GLUE and SQuAD.
    hosts.on_process_0("reading the tasks' data", lambda: plan.check_data(study))
    hosts.on_process_0("claiming the study folder", lambda: plan.claim(FLAGS.study_dir, study))
    hosts.check_shared(FLAGS.study_dir, plan.SPEC_FILE)
    results = stages.run_all(study, FLAGS.study_dir)
    if results is None:
        logging.info("study: every objective is pretrained; process 0 does the rest")
        return
    table, text = report.write(FLAGS.study_dir, results, [t.name for t in study.tasks])
    print(json.dumps(table) if FLAGS.json else text)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["study_dir"])
    errors = (readers.GlueDataError, reading.SquadDataError, RuntimeError)
    cli.run(main, errors=errors, prog="maelm_jax.study")
