"""`python -m maelm_jax.compile --config=configs/<name>.py --topology=v5p-64 [--num_slices=N]
[--json] [--flops=analytic|unrolled|skip] [--effort=fast|full] [--step_time=estimate|skip]
[--hbm_bytes=B] [--max_batch]
[--config.key=value]`.

Compiles the real train step for a TPU slice on a CPU-only machine (libtpu's compile-only
devices), through the same `sharding.create_mesh` and `programs.build` that training uses,
so a layout or memory problem shows up before a pod is reserved. Exit status: 0 the step
fits in HBM, 1 it does not, 2 it could not be judged (bad config or topology, no libtpu).

Memory is per chip, as XLA assigned it: arguments + outputs - aliased (the donated state is
written in place) + temporaries + the program itself; the compiler's own verdict decides
`fits` (it refuses to compile a step that does not fit), and the total is also compared
with the chip's usable HBM (the compiler's number, a little under the published one).

Effort: by default (`--effort=fast`) the compile asks libtpu for less work on the program's
speed (XLA's `optimization_level` O0; memory fitting as usual): mae_lm_large on
v5p-64 compiles in about 105 s instead of 152 to 174 s on a 2-core CPU. Its memory is not
quite the training compile's: a full compile's scheduler spends spare HBM (on overlap), so
its total is higher, by 0.4% to 6.4% in the large configs measured (docs/results.md, "Pod
preflight"). Where the verdict could turn on that, a fast total at `CONFIRM_SHARE` of HBM or
more, or an out-of-memory, the step is compiled again at full effort and that compile's
numbers are reported. `--effort=full` always compiles as training does; `--max_batch`
probes at full effort (its edge is exactly where the two differ).

Step time: XLA's TPU cost model (`optimal_seconds` of a compiled program) estimates the
step's time on a chip, and from it tokens/s and the MFU a run would log. An estimate, not a
measurement: it is what the compiler optimises against, and the cost model cannot see inside
Pallas kernels. It comes from two or three shallow unrolled programs (`aot/step_time.py`,
attention on XLA), compiled in threads beside the step; `--step_time=skip` leaves it out.

FLOPs: one compile is the whole preflight. By default (`--flops=analytic`) FLOPs per step
are `flop_count`'s model FLOPs (matmuls, forward + backward, optimizer; checked against
XLA's count of small unrolled programs in the tests); rematerialisation's recomputation is
not in them, so the step-time bound is what the model's work needs at the chip's bf16 peak.
XLA's own count of the configured program is no use: it counts a while loop's body once,
and scanned layers, gradient accumulation and windowed einsums (on a large mesh XLA:TPU
turns an FSDP all-gather + matmul into a loop over weight shards) are loops. `--flops=
unrolled` compiles a second program to count what the chips execute, recomputation
included: the same step with `model.scan_layers=False`, windowed einsums off, on one
micro-batch, scaled by `grad_accum_steps` (a 24-layer config: minutes more).

`--max_batch` finds the largest global batch that fits, exactly, in steps of the
data-parallel size (batch shards x `grad_accum_steps`, which every batch must divide by):
memory is nearly linear in the batch, so two compiled probes predict the answer and one
more compile on each side of it confirms it (`max_batch`).
"""

import json
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from maelm_jax.aot.analyze import EFFORTS, FLOPS_MODES, STEP_TIMES, analyze
from maelm_jax.aot.report import format_report, gib, needed
from maelm_jax.aot.topology import LibtpuMissingError
from maelm_jax.config import cli, configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hardware import tpu_chips

EXIT_DOES_NOT_FIT = 1
EXIT_ERROR = 2

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined only when it runs (tests import the module)."""
    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_string(
        "topology", None, f"TPU slice, e.g. {', '.join(tpu_chips.EXAMPLES)}.", required=True
    )
    flags.DEFINE_integer("num_slices", 1, "Slices joined over DCN (config.mesh.dcn).")
    flags.DEFINE_boolean("json", False, "Print one JSON object instead of the table.")
    flags.DEFINE_enum("flops", "analytic", FLOPS_MODES, "How to count FLOPs; see the module doc.")
    flags.DEFINE_enum("effort", "fast", EFFORTS, "Compile effort; see the module doc.")
    flags.DEFINE_enum("step_time", "estimate", STEP_TIMES, "XLA's step-time estimate or not.")
    flags.DEFINE_integer("hbm_bytes", 0, "Judge `fits` against this per chip; 0: the chip's HBM.")
    flags.DEFINE_boolean("max_batch", False, "Also find the largest batch that fits (compiles).")
    flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    jax.config.update("jax_platforms", "cpu")  # libtpu compiles; no TPU is opened
    # Nothing compiled here runs, and libtpu cannot load a compile-only program back from a
    # persistent compilation cache (jax warns and compiles it again): none is used.
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        report = analyze(
            configdict.freeze(FLAGS.config),
            FLAGS.topology,
            FLAGS.num_slices,
            FLAGS.flops,
            FLAGS.hbm_bytes or None,
            FLAGS.max_batch,
            FLAGS.effort,
            FLAGS.step_time,
        )
    except (ConfigError, LibtpuMissingError) as e:
        print(f"maelm_jax.compile: error: {e}", file=sys.stderr)
        sys.exit(EXIT_ERROR)
    print(json.dumps(report.to_json(), indent=1) if FLAGS.json else format_report(report))
    if not report.fits:
        print(
            f"maelm_jax.compile: the train step does not fit: it needs {needed(report)} of "
            f"the {gib(report.hbm_per_chip_bytes)} usable HBM per {report.chip} chip",
            file=sys.stderr,
        )
        sys.exit(EXIT_DOES_NOT_FIT)


if __name__ == "__main__":
    define_flags()
    jax.config.config_with_absl()
    cli.run(main, errors=(LibtpuMissingError,), error_status=EXIT_ERROR, prog="maelm_jax.compile")
