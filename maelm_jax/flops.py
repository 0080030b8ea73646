"""`python -m maelm_jax.flops --config=configs/mlm_base.py [--topology=v5p-64] [--mask_rate=R]
[--batch_size=B] [--seq_len=L] [--methods=mae_lm,...] [--json]`: what MAE-LM and 3ML save
over MLM, per step.

One row per method (mlm, mae_lm, 3ml_self, 3ml_cross) at the config's sizes: FLOPs by
region from XLA's cost analysis, the analytic total, the ratio to mlm
(`maelm_jax/aot/flops_by_method.py` says how each number is made). `--methods` picks some of
them (mlm always comes first: it is what the ratios divide by); each method is several
compiles (the step and one program per region), minutes each at a pod's sizes.
"""

import json
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from maelm_jax.aot.flops_by_method import METHODS, format_table, table, to_json
from maelm_jax.aot.topology import LibtpuMissingError, topology_devices
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import tpu_chips

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file (sizes).", lock_config=False)
flags.DEFINE_string("topology", None, f"TPU slice to compile for, e.g. {tpu_chips.EXAMPLES[1]}.")
flags.DEFINE_float("mask_rate", None, "One mask rate for every method; default: the papers'.")
flags.DEFINE_integer("batch_size", None, "Global batch; default: the config's.")
flags.DEFINE_integer("seq_len", None, "Sequence length; default: the config's.")
flags.DEFINE_list("methods", list(METHODS), f"Methods to compare: {', '.join(METHODS)}.")
flags.DEFINE_boolean("json", False, "Print one JSON object instead of the table.")
flags.mark_flags_as_required(["config"])


def chosen_methods(names: list[str]) -> tuple[str, ...]:
    """`names` in METHODS' order, mlm first whether named or not."""
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ConfigError(
            f"--methods={','.join(names)}: unknown {', '.join(unknown) or '(none given)'}; "
            f"allowed: {', '.join(METHODS)}"
        )
    return tuple(m for m in METHODS if m == "mlm" or m in names)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")  # with --topology, libtpu only compiles
    # Nothing compiled here runs, and libtpu cannot load a compile-only program back from a
    # persistent compilation cache (jax warns and compiles it again): none is used.
    jax.config.update("jax_enable_compilation_cache", False)
    config = FLAGS.config
    if FLAGS.batch_size:
        config.batch_size = FLAGS.batch_size
    if FLAGS.seq_len:
        config.seq_len = FLAGS.seq_len
        config.model.max_positions = max(config.model.max_positions, FLAGS.seq_len)
    try:
        methods = chosen_methods(FLAGS.methods)
        run = configdict.freeze(config)
        if FLAGS.topology:
            devices = topology_devices(tpu_chips.parse(FLAGS.topology))
            where = f"{FLAGS.topology} ({len(devices)} chips, compile-only)"
        else:
            devices = jax.devices("cpu")[:1]
            where = "1 local CPU device"
        rows = table(run, devices, FLAGS.mask_rate, methods)
    except (ConfigError, LibtpuMissingError) as e:
        print(f"maelm_jax.flops: error: {e}", file=sys.stderr)
        sys.exit(2)
    m = config.model
    shape = (
        f"{m.num_layers} x {m.hidden_size} (mlp {m.mlp_dim}), vocab {config.vocab_size}, "
        f"batch {config.batch_size} x seq {config.seq_len}"
    )
    if FLAGS.json:
        print(json.dumps(to_json(rows, model=shape, devices=where), indent=1))
    else:
        print(format_table(rows, f"One train step, {shape}, compiled for {where}"))


if __name__ == "__main__":
    jax.config.config_with_absl()
    app.run(main)
