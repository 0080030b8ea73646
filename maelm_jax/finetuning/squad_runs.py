"""SQuAD as a task of the fine-tuning search: its data (every train and dev window, built once),
its model (the export with a start/end head, hf/task_model.py), its loss (the QA model's own
(CE_start + CE_end) / 2 on the start and end positions) and its evaluation.

A run's evaluation runs the model over every dev window, decodes the answers from the start and
end logits (squad/decoding.py) and writes predictions.json, null_odds.json (2.0) and eval.json
into the run's folder, `runs/<run name>/` (squad/outputs.py). The run's score is the official
evaluation's `f1` (its `exact` beside it) at the na-prob threshold 1.0, as the papers report
SQuAD dev EM and F1, not `best_f1`, which picks the threshold on the dev set it scores.
"""

import dataclasses
import os

import numpy as np

from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.finetuning.training import DeviceSplit, RunSpec, autocast, fine_tune, upload
from maelm_jax.hf import task_model
from maelm_jax.squad import decoding, features, outputs, reading

FAMILY = "squad"


@dataclasses.dataclass(frozen=True)
class SquadTask:
    """SQuAD 2.0 or 1.1 with its recipe, where its files are, and how its windows are cut
    (`max_seq_length` and `doc_stride` None: squad/features.py's `window_shape` for the export).
    `max_dev_questions` (0: all) scores the dev set's first questions only, `--quick`'s cap."""

    version: reading.Version
    recipe: Recipe
    squad_dir: str | None = None
    tfds_data_dir: str | None = None
    max_seq_length: int | None = None
    doc_stride: int | None = None
    max_dev_questions: int = 0

    family = FAMILY
    metrics = ("exact", "f1")
    is_regression = False

    @property
    def name(self) -> str:
        return self.version.name

    def identity(self) -> dict:
        """What the search records of the task in spec.json (a change refuses a resume)."""
        return {
            "recipe": dataclasses.asdict(self.recipe),
            "data": os.path.abspath(self.squad_dir) if self.squad_dir else "tfds",
            "max_seq_length": self.max_seq_length,
            "doc_stride": self.doc_stride,
            "max_query_length": features.MAX_QUERY_LENGTH,
            "max_dev_questions": self.max_dev_questions,
        }

    def loss(self, model, ids, mask, target):
        """The QA model's own span loss; `target` [B, 2] holds the start and end positions."""
        out = model(
            input_ids=ids,
            attention_mask=mask,
            start_positions=target[:, 0],
            end_positions=target[:, 1],
        )
        return out.loss


@dataclasses.dataclass(frozen=True)
class SquadData:
    dev: list[reading.Example]  # the questions scored (capped by max_dev_questions)
    train_windows: features.Features
    dev_windows: features.Features
    seq_len: int
    doc_stride: int


def load(task: SquadTask, tokenizer, export_dir: str) -> SquadData:
    """Both splits read and checked, and their windows built, before a search writes anything."""
    train = reading.read(task.version, "train", task.squad_dir, task.tfds_data_dir)
    dev = reading.read(task.version, "dev", task.squad_dir, task.tfds_data_dir)
    if task.max_dev_questions:
        dev = dev[: task.max_dev_questions]
    seq_len, stride = features.window_shape(
        task_model.max_positions(export_dir), task.max_seq_length, task.doc_stride
    )
    return SquadData(
        dev=dev,
        train_windows=features.build(train, tokenizer, seq_len, stride),
        dev_windows=features.build(dev, tokenizer, seq_len, stride),
        seq_len=seq_len,
        doc_stride=stride,
    )


class SquadRuns:
    """The runs of one SQuAD task: its windows, uploaded once, shared by every run."""

    def __init__(self, task: SquadTask, tokenizer, export_dir: str, device):
        self.task, self.export_dir, self.device = task, export_dir, device
        self.pad_id = tokenizer.pad_token_id
        self.data = load(task, tokenizer, export_dir)
        self.on_device: DeviceSplit | None = None

    @property
    def train_size(self) -> int:
        """Rows an epoch goes over: the train windows."""
        return len(self.data.train_windows)

    @property
    def max_seq_length(self) -> int:
        return self.data.seq_len

    def run(self, run: RunSpec, slot, on_step, run_dir: str):
        if self.on_device is None:
            self.on_device = to_device(self.data.train_windows, self.pad_id, self.device)

        def factory():
            return task_model.load_for_question_answering(
                self.export_dir, run.init, run.dropout, run.attention_dropout
            )

        def scored(model):
            return evaluate(self.task, self.data, model, self.device, run_dir)

        return fine_tune(
            factory, self.task, self.on_device, {}, run, self.pad_id, self.device,
            on_step=on_step, slot=slot, train_on_device=self.on_device, evaluate=scored,
        )  # fmt: skip


def to_device(windows: features.Features, pad_id: int, device) -> DeviceSplit:
    """The train windows as the loop reads them: ids [n, longest window], labels [n, 2]."""
    lengths = windows.attention_mask.sum(axis=1).astype(np.int64)
    ids = windows.input_ids[:, : int(lengths.max())].astype(np.int64)
    labels = np.stack([windows.start_positions, windows.end_positions], axis=1).astype(np.int64)
    return DeviceSplit(upload(ids, device), upload(labels, device), lengths, pad_id)


def logits(model, windows: features.Features, device, batch_size: int = 64):
    """(start, end) logits [windows, seq_len] float32 of every window; windows sorted by length
    in between so that little of each batch is padding. Past a window's end the logits are
    -1e4, which decoding never reads (not scoreable)."""
    import torch

    lengths = windows.attention_mask.sum(axis=1)
    order = np.argsort(lengths, kind="stable")
    start = np.full(windows.input_ids.shape, -1e4, np.float32)
    end = np.full(windows.input_ids.shape, -1e4, np.float32)
    model.eval()
    with torch.inference_mode(), autocast(device):
        for first in range(0, len(order), batch_size):
            rows = order[first : first + batch_size]
            width = int(lengths[rows].max())
            ids = upload(windows.input_ids[rows, :width].astype(np.int64), device)
            mask = upload(windows.attention_mask[rows, :width].astype(np.int64), device)
            out = model(input_ids=ids, attention_mask=mask)
            start[rows, :width] = out.start_logits.float().cpu().numpy()
            end[rows, :width] = out.end_logits.float().cpu().numpy()
    return start, end


def evaluate(task: SquadTask, data: SquadData, model, device, run_dir: str):
    """({"dev": {"exact", "f1"}} as fractions, the run's score: F1 in points), with the run's
    predictions.json, null_odds.json (2.0) and eval.json written into `run_dir`."""
    start, end = logits(model, data.dev_windows, device)
    with_null = task.version.with_null
    predictions, null_odds = decoding.decode(data.dev, data.dev_windows, start, end, with_null)
    os.makedirs(run_dir, exist_ok=True)
    result = outputs.write(run_dir, task.version, data.dev, predictions, null_odds)
    exact = result["exact"] if with_null else result["exact_match"]
    return {"dev": {"exact": exact / 100, "f1": result["f1"] / 100}}, result["f1"]
