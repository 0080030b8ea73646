"""Benchmarks that print numbers: training speed and checkpoint saves on this machine.

    python -m maelm_jax.bench speed --configs=mlm_base,three_ml_self_base --seq_len=128 \
        --batch_size=8 [--rounds=8 --steps=5] [--dtype=float32] [--json]
    python -m maelm_jax.bench checkpoint --configs=mae_lm_base
    python -m maelm_jax.bench input [--sizes_mb=4,40] [--configs=mae_lm_large] [--json]
    python -m maelm_jax.bench kernels --configs=mlm_base --batch_size=64 --seq_len=512 \
        --steps=3 [--top=15] [--logdir=DIR] [--json]
    python -m maelm_jax.bench finetune [--finetune_encoder=4x128 --batch_size=32 --seq_len=64]
        [--finetune_export=DIR --finetune_task=sst2 --glue_dir=DIR] [--finetune_steps=N]
        [--finetune_rounds=3] [--finetune_compile] [--json]
    python -m maelm_jax.bench finetune --finetune_task=squad_v2 [--finetune_encoder=4x128
        --batch_size=16 --seq_len=384] [--finetune_export=DIR --squad_dir=DIR] [--json]

`--configs` takes config names in configs/ or paths to config files (ending in .py).

`speed`: the real sharded train step against this machine's matmul rate
(`maelm_jax/training/step_speed.py`); `checkpoint`: a save and a restore of a state the
size of the config's (`maelm_jax/checkpoints/save_speed.py`); `input`: the data side on
synthetic corpora of `--sizes_mb` (`maelm_jax/data/input_speed.py`), next to the tokens/s a
v5p host's step of the first of `--configs` (default there: mae_lm_large) consumes at the
chips' peak; `kernels`: a `jax.profiler` trace of `--steps` steps of each config's real train
step, summed up by kernel (GPU) or XLA op (CPU) and by category (matmul, attention,
scatter/gather, copies, elementwise, reductions, collectives; `maelm_jax/profiling/`). FLOPs
per step by method and region: `python -m maelm_jax.flops`. `finetune`: the PyTorch GLUE
fine-tuning step (finetuning/training.py) of a random-init relative-bias export, the loop before
issue #63 and each change since, cumulatively (`maelm_jax/benchmarks/finetune_speed.py`);
with `--finetune_task=squad_v2` (or squad_v1), SQuAD's loop against transformers' `Trainer`
on the same model and batches (`maelm_jax/benchmarks/squad_speed.py`).
"""

import dataclasses
import importlib
import json
import os
import pathlib
import sys
import tempfile

import jax
from absl import app, flags

from maelm_jax.checkpoints import save_speed
from maelm_jax.config import cli, configdict
from maelm_jax.config.run_config import RunConfig
from maelm_jax.data import input_speed, preparation, prepared
from maelm_jax.data.tokenizer import Tokenizer
from maelm_jax.glue.readers import GlueDataError
from maelm_jax.hardware import host_cpus, platforms, tpu_chips
from maelm_jax.model import flop_count
from maelm_jax.profiling import summary, trace_files
from maelm_jax.squad import reading
from maelm_jax.training import step_speed

_CONFIGS_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"

flags.DEFINE_list(
    "configs",
    ["mlm_base", "three_ml_self_base"],
    "Configs in configs/ by name (mlm_base), or config files by path (my_run.py).",
)
flags.DEFINE_integer(
    "batch_size",
    None,
    "Global batch; default: each config's own, a pod's (a step that does not fit here is one "
    "error line naming it).",
    lower_bound=1,
)
flags.DEFINE_integer("seq_len", None, "Sequence length; default: each config's own.", lower_bound=2)
flags.DEFINE_integer(
    "steps", 5, "`speed`: timed steps per config and round; `kernels`: traced steps.", 1
)
flags.DEFINE_integer("top", 15, "`kernels`: kernels listed (the categories cover all).", 1)
flags.DEFINE_string("logdir", None, "`kernels`: where the traces go; default: a new temp dir.")
flags.DEFINE_integer(
    "rounds", 8, "`speed`: rounds, each timing every config in turn.", lower_bound=1
)
flags.DEFINE_enum(
    "dtype",
    None,
    ["float32", "bfloat16"],
    "`speed`: compute dtype; default: float32 on CPU (which emulates bf16 matmuls), else "
    "each config's own.",
)
flags.DEFINE_boolean("json", False, "`speed`, `input`: one JSON object instead of the table.")
flags.DEFINE_list("sizes_mb", ["4", "40"], "`input`: synthetic corpus sizes, MB of text.")
flags.DEFINE_integer("input_steps", 200, "`input`: batches drawn to time the pipeline.", 1)
flags.DEFINE_string("input_dir", None, "`input`: where corpora go; default: a new temp dir.")
flags.DEFINE_integer("hosts", 8, "`input`: hosts sharing the global batch (v5p-64: 8).", 1)
flags.DEFINE_string(
    "finetune_encoder", "4x128", "`finetune`: LAYERSxWIDTH (heads of 64, MLP 4x); the CPU "
    "study's is 4x128, the GPU preset's 6x512."
)  # fmt: skip
flags.DEFINE_string(
    "finetune_export", None, "`finetune`: an export to time instead of a random-init one."
)
flags.DEFINE_string(
    "finetune_task", None, "`finetune`: a GLUE task whose train rows (tokenized by "
    "--finetune_export's tokenizer) replace the synthetic ones; or squad_v2 / squad_v1: our "
    "SQuAD loop against transformers' Trainer (synthetic windows without --squad_dir)."
)  # fmt: skip
flags.DEFINE_string("glue_dir", None, "`finetune`: GLUE's download for --finetune_task; else TFDS.")
flags.DEFINE_string(
    "squad_dir", None, "`finetune` on squad_v2/v1: SQuAD's files, whose train windows "
    "(tokenized by --finetune_export's tokenizer) replace the synthetic ones."
)  # fmt: skip
flags.DEFINE_float(
    "finetune_dropout", 0.1, "`finetune` on squad_v2/v1: the model's dropout (at 0 both "
    "loops' first loss is the same number).", lower_bound=0, upper_bound=1
)  # fmt: skip
flags.DEFINE_integer(
    "finetune_steps", None, "`finetune`: timed steps per variant and round; default 20 (CPU), "
    "100 (GPU).", 1
)  # fmt: skip
flags.DEFINE_integer(
    "finetune_rounds", 3, "`finetune`: rounds, each timing every variant in turn.", lower_bound=1
)
flags.DEFINE_boolean(
    "finetune_compile", None, "`finetune`: add the torch.compile variant; default: on CUDA only."
)
_CONFIG_NAMES = sorted(
    p.stem for p in _CONFIGS_DIR.glob("*.py") if "\ndef get_config(" in p.read_text()
)


def _is_config(name: str) -> bool:
    return name in _CONFIG_NAMES or (name.endswith(".py") and os.path.isfile(name))


flags.register_validator(
    "configs",
    lambda names: all(_is_config(name) for name in names),
    message=f"--configs names a config that is not in {_CONFIGS_DIR} nor a .py file that "
    "exists; the configs there: " + ", ".join(_CONFIG_NAMES),
)
FLAGS = flags.FLAGS


def _config(name: str, dtype: str | None = None) -> RunConfig:
    """configs/`name`.py (or the config file `name`, a path ending in .py) with the command's
    --batch_size, --seq_len and `dtype`, frozen."""
    if name.endswith(".py"):
        config = cli.load_config_file(name, flag="configs")
    else:
        config = importlib.import_module(f"configs.{name}").get_config()
    if FLAGS.batch_size:
        config.batch_size = FLAGS.batch_size
    if FLAGS.seq_len:
        config.seq_len = FLAGS.seq_len
    if dtype:
        config.model.dtype = dtype
    return configdict.freeze(config)


def _speed_dtype() -> str | None:
    if FLAGS.dtype:
        return FLAGS.dtype
    return "float32" if jax.default_backend() == "cpu" else None


def run_speed() -> None:
    dtype = _speed_dtype()
    runs = {name: _config(name, dtype) for name in FLAGS.configs}
    result = step_speed.measure(runs, FLAGS.steps, FLAGS.rounds)
    print(json.dumps(result) if FLAGS.json else step_speed.format_result(result))


def run_kernels() -> None:
    """Each config's step traced and summed up by kernel and category (`maelm_jax/profiling/`)."""
    dtype = _speed_dtype()
    root = FLAGS.logdir or tempfile.mkdtemp(prefix="maelm_jax_kernels_")
    found = {}
    for name in FLAGS.configs:
        logdir = os.path.join(root, name)
        xplane, wall_ms = trace_files.trace_steps(_config(name, dtype), FLAGS.steps, logdir)
        found[name] = dataclasses.replace(
            trace_files.summarise_trace(xplane, FLAGS.steps, jax.local_device_count()),
            wall_ms_per_step=wall_ms,
            device_kind=jax.devices()[0].device_kind,
        )
        if not FLAGS.json:
            print(f"== {name}\n{summary.format_summary(found[name], FLAGS.top)}")
            print(f"XProf trace in {logdir} (xprof --logdir={logdir})\n")
    if FLAGS.json:
        print(json.dumps({name: s.to_json(FLAGS.top) for name, s in found.items()}))


def run_finetune() -> None:
    """`--batch_size` (default 32) rows of `--seq_len` (default 64, or 128 on a task's rows)
    tokens a step."""

    from maelm_jax.benchmarks import finetune_speed

    export_dir, task = FLAGS.finetune_export, FLAGS.finetune_task
    if task in reading.VERSIONS:
        return _run_squad_finetune(export_dir, task)
    if FLAGS.squad_dir is not None:
        raise app.UsageError("--squad_dir goes with --finetune_task=squad_v2 or squad_v1")
    if task is not None and export_dir is None:
        raise app.UsageError("--finetune_task needs --finetune_export (its tokenizer)")
    shape = _shape(
        export_dir,
        task or "synthetic",
        FLAGS.batch_size or 32,
        FLAGS.seq_len or (128 if task else 64),
    )
    data = None
    if task is not None:
        data = finetune_speed.task_rows(export_dir, task, shape["seq_len"], FLAGS.glue_dir, None)
    _measure_and_print(finetune_speed, shape, export_dir, data)


def _measure_and_print(speed, shape: dict, export_dir, data, **options) -> None:
    """Times `shape` with `speed` (benchmarks.finetune_speed or squad_speed: one interface),
    a row printed as each variant finishes, the table's header or the JSON at the end."""
    import torch

    cuda = torch.cuda.is_available()
    base = {}

    def show(name, row):
        if not FLAGS.json:
            base.setdefault("row", row)
            print(speed.format_row(name, row, base["row"]), flush=True)

    if not FLAGS.json:
        print(", ".join(f"{k}={v}" for k, v in shape.items()), flush=True)
    result = speed.measure(
        shape,
        export_dir,
        data,
        timed=FLAGS.finetune_steps or (100 if cuda else 20),
        rounds=FLAGS.finetune_rounds,
        compile_=cuda if FLAGS.finetune_compile is None else FLAGS.finetune_compile,
        on_row=show,
        **options,
    )
    print(json.dumps(result) if FLAGS.json else speed.header(result["shape"]))


def _shape(export_dir, rows: str, batch: int, seq_len: int) -> dict:
    """What `bench finetune` times: the export's layers and width, or --finetune_encoder's."""
    from maelm_jax.glue import classifier

    if export_dir is not None:
        config = classifier.export_config(export_dir, flag="--finetune_export")
        layers, width = config["num_hidden_layers"], config["hidden_size"]
    else:
        layers, sep, width = FLAGS.finetune_encoder.partition("x")
        if not (sep and layers.isdigit() and width.isdigit()):
            raise app.UsageError(f"--finetune_encoder={FLAGS.finetune_encoder}: give LAYERSxWIDTH")
    return {"layers": int(layers), "width": int(width), "batch": batch, "seq_len": seq_len,
            "rows": rows}  # fmt: skip


def _run_squad_finetune(export_dir, task: str) -> None:
    """`--batch_size` (default 16) windows of `--seq_len` (default 384) tokens a step, through
    our loop and transformers' Trainer."""

    from maelm_jax.benchmarks import squad_speed
    from maelm_jax.hf import task_model

    if FLAGS.squad_dir is not None and export_dir is None:
        raise app.UsageError("--squad_dir needs --finetune_export (its tokenizer)")
    shape = _shape(export_dir, task, FLAGS.batch_size or 16, FLAGS.seq_len or 384)
    if export_dir is not None and shape["seq_len"] > task_model.max_positions(export_dir):
        raise app.UsageError(
            f"--seq_len={shape['seq_len']} is more than --finetune_export's "
            f"{task_model.max_positions(export_dir)} positions; give --seq_len at most that"
        )
    windows = None
    if FLAGS.squad_dir is not None:
        windows = squad_speed.real_windows(export_dir, task, FLAGS.squad_dir, shape["seq_len"])
    _measure_and_print(squad_speed, shape, export_dir, windows, dropout=FLAGS.finetune_dropout)


def run_checkpoint() -> None:
    for name in FLAGS.configs:
        print(save_speed.format_result(name, save_speed.measure(_config(name))))


_V5P_CHIPS_PER_HOST = 4


def _consumed(name: str) -> dict:
    """Tokens/s one v5p host's chips consume for config `name` at 100% of peak: what the
    pipeline must outrun whatever the MFU."""
    run = _config(name)
    per_token = flop_count.step_flops(run, flop_count.num_params(run)) / (
        run.batch_size * run.seq_len
    )
    peak = _V5P_CHIPS_PER_HOST * tpu_chips.CHIPS["v5p"].peak_bf16_flops
    tokens = run.batch_size * run.seq_len // FLAGS.hosts
    return {"config": name, "host": "v5p", "mfu": 1.0, "tokens_per_sec": peak / per_token,
            "tokens_per_host_batch": tokens}  # fmt: skip


def _size_row(root: pathlib.Path, megabytes: float) -> tuple[dict, object]:
    """Prepare and the two 2-step runs on one synthetic corpus; (row, its DataConfig)."""
    glob = input_speed.write_synthetic_corpus(root / "corpus", megabytes)
    config = importlib.import_module("configs.default").get_config()
    config.dataset, config.data_dir = glob, str(root / "data")
    data = configdict.freeze(config).data
    workers = host_cpus.usable_cpus()
    report = preparation.prepare(data, workers=workers)
    command = [
        sys.executable, "-m", "maelm_jax.main", "--config=configs/default.py",
        f"--config.dataset={glob}", "--config.num_train_steps=2", "--config.warmup_steps=1",
        "--config.eval_every_steps=2", "--config.checkpoint_every_steps=2",
    ]  # fmt: skip
    runs = {}
    cases = (("unprepared_run", root / "unprepared"), ("prepared_run", root / "data"))
    for name, data_dir in cases:
        flags_ = [f"--config.data_dir={data_dir}", f"--workdir={root / name}"]
        runs[name] = input_speed.run_and_measure(command + flags_, _CONFIGS_DIR.parent)
    mb = report["text_bytes"] / 1e6
    row = {
        "text_mb": mb,
        "prepare": {
            "seconds": report["pack_seconds"],
            "workers": report["pack_workers"],
            "mb_per_s_per_core": mb
            / report["pack_seconds"]
            / min(workers, host_cpus.usable_cpus()),
        },
        **runs,
    }
    return row, data


def run_input() -> None:
    root = pathlib.Path(FLAGS.input_dir or tempfile.mkdtemp(prefix="maelm_bench_input_"))
    result = {"sizes": []}
    for mb in FLAGS.sizes_mb:
        row, data = _size_row(root / f"{mb}mb", float(mb))
        result["sizes"].append(row)
    consumed = _consumed(FLAGS.configs[0] if FLAGS["configs"].present else "mae_lm_large")
    result["consumed"] = consumed
    tokenizer = Tokenizer.from_path(prepared.tokenizer_path(data))
    rows = max(1, consumed["tokens_per_host_batch"] // data.seq_len)
    result["delivered"] = input_speed.delivered_tokens_per_s(
        data, tokenizer, rows, FLAGS.input_steps
    )
    print(json.dumps(result) if FLAGS.json else input_speed.format_result(result))


def main(argv):
    cli.quiet_library_logs()
    platforms.skip_absent_tpu()
    commands = {
        "speed": run_speed,
        "checkpoint": run_checkpoint,
        "input": run_input,
        "kernels": run_kernels,
        "finetune": run_finetune,
    }
    usage = (
        f"usage: python -m maelm_jax.bench {{{'|'.join(commands)}}} [flags] "
        "(FLOPs per step: python -m maelm_jax.flops --config=...)"
    )
    if len(argv) == 2 and argv[1] not in commands:
        raise app.UsageError(f"no benchmark {argv[1]!r}; {usage}")
    if len(argv) != 2:
        raise app.UsageError(usage)
    commands[argv[1]]()


if __name__ == "__main__":
    cli.run(main, errors=(step_speed.DoesNotFit, GlueDataError), prog="maelm_jax.bench")
