"""`python -m maelm_jax.profile --config=configs/<name>.py [--steps=3] [--batch_size=B]
[--seq_len=L] [--top=15] [--logdir=DIR] [--json] [--config.key=value]`: where a train
step's time goes, without opening a UI.

Builds the real sharded train step as `bench speed` does (`step_speed._Timed`: the mesh,
`programs.build`, random token ids), runs it once to compile and once more to warm up, then
traces `--steps` steps with `jax.profiler` into `--logdir` (default: a new temp dir; the
path is printed) and prints the kernels (GPU) or XLA ops (CPU) by time per step and the
shares by category (`maelm_jax/training/kernel_summary.py` says where the table comes from:
XProf's kernel_stats / hlo_stats where the `xprof` package is installed and has rows, else
the trace's events). The trace opens in XProf as any other (`xprof --logdir=DIR`).

On a GPU:

    python -m maelm_jax.profile --config=configs/mlm_base.py --batch_size=64 --seq_len=512 \
        --steps=3
"""

import dataclasses
import json
import tempfile

import jax
from absl import app, flags
from ml_collections import config_flags

from maelm_jax import cli, configuration
from maelm_jax.training import kernel_summary, metric_logging, step_speed

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=False)
flags.DEFINE_integer("steps", 3, "Steps traced (after a compile and a warm-up step).", 1)
flags.DEFINE_integer("batch_size", None, "Global batch; default: the config's.", 1)
flags.DEFINE_integer("seq_len", None, "Sequence length; default: the config's.", 2)
flags.DEFINE_integer("top", 15, "Kernels listed (the JSON too); the categories cover all.", 1)
flags.DEFINE_string("logdir", None, "Where the trace goes; default: a new temp dir.")
flags.DEFINE_boolean("json", False, "Print one JSON object instead of the tables.")
flags.mark_flags_as_required(["config"])


def trace(config, steps: int, logdir: str) -> tuple[str, float]:
    """(the trace's .xplane.pb, wall ms per traced step) of `steps` steps of `config`'s
    train step, after its compile and one warm-up step."""
    timed = step_speed._Timed("profile", config)  # compiles, runs a step
    timed.run(1)  # warm-up: the first step's one-off work stays out of the trace
    jax.profiler.start_trace(logdir)
    try:
        seconds = timed.run(steps)
    finally:
        jax.profiler.stop_trace()
    return kernel_summary.find_xplane(logdir), seconds / steps * 1e3


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    metric_logging.quiet_library_logs()
    config = FLAGS.config
    if FLAGS.batch_size:
        config.batch_size = FLAGS.batch_size
    if FLAGS.seq_len:
        config.seq_len = FLAGS.seq_len
        config.model.max_positions = max(config.model.max_positions, FLAGS.seq_len)
    run = configuration.freeze(config)
    logdir = FLAGS.logdir or tempfile.mkdtemp(prefix="maelm_jax_profile_")
    xplane, wall_ms = trace(run, FLAGS.steps, logdir)
    summary = dataclasses.replace(
        kernel_summary.summarise_trace(xplane, FLAGS.steps, jax.local_device_count()),
        wall_ms_per_step=wall_ms,
        device_kind=jax.devices()[0].device_kind,
    )
    if FLAGS.json:
        print(json.dumps(summary.to_json(FLAGS.top)))
    else:
        print(kernel_summary.format_summary(summary, FLAGS.top))
        print(f"\nXProf trace in {logdir} (xprof --logdir={logdir})")


if __name__ == "__main__":
    jax.config.config_with_absl()
    cli.run(main, errors=(step_speed.DoesNotFit,), prog="maelm_jax.profile")
