"""Every run of the recipe's grid on an export, resumable run by run, and the papers' summary.

`output_dir` holds `spec.json` (what was asked: the export's identity, the recipe, the tasks,
where it computes: the device type and its precision, `compute_identity`, and how the loop
runs, as far as that changes the numbers: `loop_identity`), `runs/<run>.json` (one per
finished run, written whole or not at all) and, once every run is done, `results.json`. A
rerun with the same spec reuses the finished runs, so a killed search goes on where it
stopped; a rerun with another spec is refused, naming each changed key with both values,
rather than mixed in. Nothing is written before the export and every task's data have been
read and checked.

Each task's reported setting is the one with the best median over seeds; the table gives that
median and the seeds' range (RoBERTa, COCO-LM and MAE-LM report dev medians over five seeds).
"""

import dataclasses
import hashlib
import json
import os
import statistics
import time

from absl import logging

from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import glue_runs, squad_runs
from maelm_jax.finetuning.model_slot import LoopOptions, ModelSlot
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.finetuning.training import RunResult, RunSpec, steps_for
from maelm_jax.glue import classifier, metrics, readers

SPEC_FILE = "spec.json"
RESULTS_FILE = "results.json"


@dataclasses.dataclass(frozen=True)
class TaskSummary:
    task: str
    init: str
    metrics: tuple[str, ...]
    learning_rate: float  # the best setting's
    batch_size: int
    seeds: tuple[int, ...]
    scores: tuple[float, ...]  # per seed, GLUE points
    median: float
    low: float
    high: float
    metric_medians: dict[str, dict[str, float]]  # dev split -> metric -> median (points)
    settings: dict[str, float]  # "lr=..,bs=.." -> median score, every setting tried
    seconds: float  # all of this task's runs
    family: str = "glue"  # "squad": its score is F1, never in the GLUE average
    # dev split -> metric -> [lowest, highest] over the seeds (points)
    metric_ranges: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def export_identity(export_dir: str) -> dict:
    """What makes two exports the same model: the weights' and the config's bytes."""
    weights = os.path.join(export_dir, "model.safetensors")
    return {
        "path": os.path.abspath(export_dir),
        "model.safetensors": _sha256(weights),
        "config.json": _sha256(os.path.join(export_dir, "config.json")),
    }


def compute_identity(device) -> dict:
    """Where a run computes, as far as it changes the numbers: bf16 autocast on CUDA, float32
    elsewhere (finetuning/training.py). Runs of one search, or rows of one study, computed on two
    of these are not comparable to float noise, so a resume on the other is refused."""
    kind = getattr(device, "type", str(device)).split(":")[0]
    return {"device": kind, "precision": "bf16-autocast" if kind == "cuda" else "float32"}


def loop_identity(options: LoopOptions, device) -> dict:
    """What of `LoopOptions` changes a run's numbers beyond float rounding, as it acts on
    `device`: a compiled model draws its dropout masks in Inductor's kernels, an eager one on
    a CPU from host_dropout's blocks (else PyTorch's), and a mask's draw follows its shape,
    which width buckets change. A search holds runs of one of these only."""
    kind = getattr(device, "type", str(device)).split(":")[0]
    compiled = options.compile
    return {
        "compile": options.compile_mode if compiled else "none",
        "host_dropout": options.host_dropout and kind == "cpu" and not compiled,
        "width_buckets": compiled if options.width_buckets is None else options.width_buckets,
    }


def write_json(path: str, value) -> None:
    """Whole or not at all: a killed write leaves no file a later run would trust."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def claim_output_dir(output_dir: str, spec: dict) -> None:
    """Creates `output_dir` for `spec`, or accepts it when it holds the same spec (an older
    spec.json read as `_as_recorded_now` says); refuses, touching nothing, a folder with
    another spec, or with files that are not a search's."""
    path = os.path.join(output_dir, SPEC_FILE)
    spec = json.loads(json.dumps(spec))  # as it reads back: tuples are lists
    if os.path.isfile(path):
        with open(path) as f:
            written = json.load(f)
        old = _as_recorded_now(written, spec, output_dir)
        where, was = spec.get("compute"), old.get("compute")
        if where is not None and where != was:
            raise ConfigError(
                f"--output_dir={output_dir} holds a fine-tuning search computed on "
                f"{_where(was)}; this machine computes on {_where(where)}. Its results are "
                "not mixed: resume it where it ran, or give a new --output_dir"
            )
        if old != spec:
            raise ConfigError(
                f"--output_dir={output_dir} holds a fine-tuning search asked otherwise "
                f"({'; '.join(_changes(old, spec))}); give a new --output_dir (its results "
                "are not mixed)"
            )
        if written != old:
            added = " and ".join(sorted(old.keys() - written.keys()))
            logging.info("%s: spec.json now records %s, as its runs implied", output_dir, added)
            write_json(path, spec)
        return
    ours = ("export-step",)  # finetune --workdir's export, made before the spec exists
    if os.path.isdir(output_dir) and any(not n.startswith(ours) for n in os.listdir(output_dir)):
        raise ConfigError(
            f"--output_dir={output_dir} exists, is not empty and holds no {SPEC_FILE}; give a "
            "new or empty folder"
        )
    os.makedirs(os.path.join(output_dir, "runs"), exist_ok=True)
    write_json(path, spec)


def _as_recorded_now(old: dict, spec: dict, output_dir: str) -> dict:
    """`old` with the keys recorded since it was written, read as the values it implied.
    `compute` (recorded from 2026-11-28): the device torch picked then, as now, so this
    machine's, unless results.json names another. `loop` (from 2026-11-29): the eager loop,
    as without `--compile` (CPU runs before 2026-11-28 22:21 UTC drew PyTorch's masks,
    another draw of the same rate: docs/evaluation.md)."""
    old = dict(old)
    if "compute" not in old and "compute" in spec:
        device = spec["compute"]["device"]
        results = os.path.join(output_dir, RESULTS_FILE)
        if os.path.isfile(results):
            with open(results) as f:
                device = json.load(f).get("device", device)
        old["compute"] = compute_identity(device)
    if "loop" not in old and "loop" in spec:
        old["loop"] = loop_identity(LoopOptions(), old.get("compute", {}).get("device", "cpu"))
    return old


def _changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for each differing leaf; the recipe's keys bare (they are the
    flags' names), the others dotted (`export.path`, `loop.compile`)."""
    changes = []
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key), new.get(key)
        if was == now:
            continue
        if isinstance(was, dict) and isinstance(now, dict):
            inner = "" if key == "recipe" and not prefix else f"{prefix}{key}."
            changes += _changes(was, now, inner)
        else:
            changes.append(f"{prefix}{key}: {_shown(was)} -> {_shown(now)}")
    return changes


def _shown(value) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return f"sha256 {value[:12]}..."  # the export's weights or config
    return "(none)" if value is None else json.dumps(value)


def _where(compute: dict | None) -> str:
    if not compute:
        return "an unrecorded device and precision"
    return f"device={compute['device']}, precision={compute['precision']}"


class Progress:
    """Steps done over the steps planned for the whole search, with a rate and an ETA;
    logged at most every `every_s` seconds (and at each run's end). A run reports every few
    steps (its loss is read that often), so `step` counts from the run's `step`."""

    def __init__(self, total_steps: int, every_s: float = 10.0):
        self.total, self.done, self.every_s = total_steps, 0, every_s
        self.finished = 0  # steps of the runs done
        self.start = self.last = time.perf_counter()

    def skip(self, steps: int) -> None:
        self.total -= steps

    def step(self, name: str, step: int, steps: int, loss: float) -> None:
        self.done = self.finished + step
        if step == steps:
            self.finished += steps
        now = time.perf_counter()
        if now - self.last < self.every_s and step != steps:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        eta = (self.total - self.done) / rate if rate else float("inf")
        logging.info(
            "%s: step %d/%d, loss %.4f | search %.0f%% (%d/%d steps), %.2f steps/s, ETA %s",
            name, step, steps, loss, 100 * self.done / max(self.total, 1), self.done,
            self.total, rate, time.strftime("%H:%M:%S", time.gmtime(eta)),
        )  # fmt: skip


def _load_run(path: str, spec: RunSpec) -> RunResult | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        saved = json.load(f)
    if saved["spec"] != dataclasses.asdict(spec):
        return None
    return RunResult(**{**saved, "spec": spec})


def summarize(task, init: str, results: list[RunResult]) -> TaskSummary:
    by_setting: dict[tuple[float, int], list[RunResult]] = {}
    for r in results:
        by_setting.setdefault((r.spec.learning_rate, r.spec.batch_size), []).append(r)
    medians = {k: statistics.median(r.score for r in v) for k, v in by_setting.items()}
    best = max(medians, key=lambda k: (medians[k], -k[0]))  # ties: the smaller lr
    runs = by_setting[best]
    scores = tuple(r.score for r in runs)
    splits = runs[0].metrics
    return TaskSummary(
        task=task.name,
        init=init,
        metrics=task.metrics,
        learning_rate=best[0],
        batch_size=best[1],
        seeds=tuple(r.spec.seed for r in runs),
        scores=scores,
        median=statistics.median(scores),
        low=min(scores),
        high=max(scores),
        metric_medians={
            split: {
                m: 100 * statistics.median(r.metrics[split][m] for r in runs) for m in splits[split]
            }
            for split in splits
        },
        settings={f"lr={k[0]:g},bs={k[1]}": v for k, v in medians.items()},
        seconds=sum(r.seconds for r in results),
        family=family(task),
        metric_ranges={
            split: {
                m: [100 * f(r.metrics[split][m] for r in runs) for f in (min, max)]
                for m in splits[split]
            }
            for split in splits
        },
    )


def load_data(task_list, glue_dir, tfds_data_dir):
    """{task: (train, {dev split: examples})}, every file read and checked up front."""
    data = {}
    for task in task_list:
        train = readers.read(task, "train", glue_dir, tfds_data_dir)
        dev = {s: readers.read(task, s, glue_dir, tfds_data_dir) for s in task.dev_splits}
        data[task.name] = (train, dev)
    return data


def family(task) -> str:
    """ "glue" for GLUE's tasks; another family's task says its own (SquadTask: "squad")."""
    return getattr(task, "family", glue_runs.FAMILY)


def run_search(
    export_dir: str,
    task_list: list,
    recipe: Recipe,
    output_dir: str,
    inits: tuple[str, ...] = ("pretrained",),
    glue_dir: str | None = None,
    tfds_data_dir: str | None = None,
    options: LoopOptions | None = None,
) -> dict:
    """Runs (or picks up) every run and returns what results.json holds. `task_list` holds
    GLUE's tasks (glue/tasks.py), run with `recipe`, and other families' tasks (a
    squad_runs.SquadTask), each with its own recipe. The runs of a task share its data,
    uploaded once, and one model on the device (`model_slot.ModelSlot`)."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    options = options or LoopOptions()
    for init in inits:
        if init not in classifier.INITS:
            raise ConfigError(f"--inits: {init!r}; allowed: {', '.join(classifier.INITS)}")
    classifier.export_config(export_dir)
    tok = classifier.tokenizer(export_dir)
    glue = [t for t in task_list if family(t) == glue_runs.FAMILY]
    data = load_data(glue, glue_dir, tfds_data_dir)
    limit = min(tok.model_max_length, recipe.max_seq_length)
    runners = {
        t.name: glue_runs.GlueRuns(t, tok, *data[t.name], export_dir, device, limit)
        if family(t) == glue_runs.FAMILY
        else squad_runs.SquadRuns(t, tok, export_dir, device)
        for t in task_list
    }
    spec = {
        "export": export_identity(export_dir),
        "recipe": dataclasses.asdict(recipe),
        "tasks": [t.name for t in task_list],
        "inits": list(inits),
        "data": os.path.abspath(glue_dir) if glue_dir else "tfds",
        "compute": compute_identity(device),
        "loop": loop_identity(options, device),
    }
    others = {t.name: t.identity() for t in task_list if family(t) != glue_runs.FAMILY}
    if others:  # recorded only where asked, so GLUE's searches resume as before
        spec["families"] = others
    claim_output_dir(output_dir, spec)
    plan = [
        (t, init, getattr(t, "recipe", recipe).runs(t.name, init, runners[t.name].max_seq_length))
        for t in task_list
        for init in inits
    ]
    sizes = {t.name: runners[t.name].train_size for t in task_list}
    progress = Progress(sum(steps_for(r, sizes[t.name]) for t, _, rs in plan for r in rs))
    logging.info(
        "fine-tuning %s on %s (%s): %d runs, %d steps on %s",
        export_dir, ",".join(sizes), ",".join(inits), sum(len(rs) for _, _, rs in plan),
        progress.total, device,
    )  # fmt: skip
    summaries = []
    for task, init, run_specs in plan:
        slot = ModelSlot(device, options)
        results = []
        for run in run_specs:
            path = os.path.join(output_dir, "runs", f"{run.name}.json")
            done = _load_run(path, run)
            if done is None:
                done = runners[task.name].run(
                    run, slot,
                    lambda s, n, loss, name=run.name: progress.step(name, s, n, loss),
                    os.path.join(output_dir, "runs", run.name),
                )  # fmt: skip
                write_json(path, dataclasses.asdict(done))
                logging.info("%s: score %.2f (%.0f s)", run.name, done.score, done.seconds)
            else:
                progress.skip(done.steps)
            results.append(done)
        summaries.append(summarize(task, init, results))
    result = {
        "export": spec["export"],
        "device": str(device),
        "recipe": spec["recipe"],
        "tasks": [dataclasses.asdict(s) for s in summaries],
        "glue_score": {  # GLUE's tasks alone: another family's score is never averaged in
            init: metrics.glue_score(
                {s.task: s.median for s in summaries if s.init == init and s.family == "glue"}
            )
            for init in inits
            if glue
        },
    }
    if others:
        result["families"] = others
    write_json(os.path.join(output_dir, RESULTS_FILE), result)
    return result
