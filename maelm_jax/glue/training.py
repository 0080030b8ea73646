"""One fine-tuning run: a task, a learning rate, a batch size, a seed -> dev metrics.

RoBERTa's GLUE recipe (fairseq `README.glue.md`): AdamW with betas (0.9, 0.98), eps 1e-6 and
decoupled weight decay (not on biases and LayerNorm weights, as transformers' Trainer
excludes them), linear warmup over the first `warmup_ratio` of the steps and linear decay to
zero, no gradient clipping, cross-entropy (MSE for STS-B's regression) on the `<s>` head.
The data order and the head's initialisation come from the seed alone, so a rerun with the
same seed draws the same batches and the same head. The score is the model's after the last
step (no checkpoint picked on the dev set it is scored on).
"""

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from maelm_jax.glue import metrics
from maelm_jax.glue.readers import Example
from maelm_jax.glue.tasks import Task

GROUP = 50  # batches sorted by length together (`_batch_order`)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    task: str
    init: str  # "pretrained" | "random"
    learning_rate: float
    batch_size: int
    seed: int
    epochs: float
    max_steps: int  # 0: no cap
    warmup_ratio: float
    weight_decay: float
    dropout: float
    attention_dropout: float
    max_seq_length: int
    max_train_examples: int  # 0: the whole train set

    @property
    def name(self) -> str:
        return (
            f"{self.task}-{self.init}-lr{self.learning_rate:g}-bs{self.batch_size}-seed{self.seed}"
        )


@dataclasses.dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    metrics: dict[str, dict[str, float]]  # dev split -> metric -> value (fractions)
    score: float  # GLUE points (x100), the task's mean metric
    steps: int
    train_examples: int
    final_train_loss: float  # mean over the last 10% of steps
    seconds: float


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A split tokenised once and shared by every run that reads it: ragged id rows."""

    ids: list[np.ndarray]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def encode(tokenizer, examples: Sequence[Example], max_seq_length: int) -> Encoded:
    """`<s> A </s>` or `<s> A </s></s> B </s>`, cut to `max_seq_length` (longest first)."""
    a = [e.text_a for e in examples]
    b = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    out = tokenizer(a, b, truncation=True, max_length=max_seq_length)
    ids = [np.asarray(row, np.int64) for row in out["input_ids"]]
    return Encoded(ids, np.asarray([e.label for e in examples]))


def steps_for(spec: RunSpec, num_train: int) -> int:
    n = min(num_train, spec.max_train_examples or num_train)
    steps = max(1, math.ceil(spec.epochs * n / spec.batch_size))
    return min(steps, spec.max_steps) if spec.max_steps else steps


def _pad(rows: list[np.ndarray], pad_id: int):
    import torch

    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    ids = torch.from_numpy(ids)
    return ids, ids != pad_id


def _batch_order(lengths: np.ndarray, batch_size: int, steps: int, rng: np.random.Generator):
    """Index batches for `steps` steps, a fresh shuffle each epoch (its last partial batch
    kept), rows of similar length batched together: each epoch's permutation is cut into
    groups of `GROUP` batches, each group sorted by length and cut into batches, and the
    batches shuffled (fairseq batches by size, transformers' `group_by_length` likewise).
    Padding to a batch's longest row then costs little: an SST-2 epoch at batch 32 pads to
    1.04x its real tokens, against 3.1x shuffled plainly (the demo's tokenizer)."""
    n, done = len(lengths), 0
    while True:
        perm = rng.permutation(n)
        batches = []
        for g in range(0, n, GROUP * batch_size):
            group = perm[g : g + GROUP * batch_size]
            group = group[np.argsort(lengths[group], kind="stable")]
            batches += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
        for b in rng.permutation(len(batches)):
            if done == steps:
                return
            yield batches[b]
            done += 1


def _optimizer(model, spec: RunSpec, steps: int):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": spec.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=spec.learning_rate,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    warmup = int(spec.warmup_ratio * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _autocast(device):
    import contextlib

    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def predict(model, data: Encoded, pad_id: int, device, regression: bool, batch_size: int = 128):
    """Class ids [n] (or scores [n]) for every row, in order; rows sorted by length in
    between so that little of each batch is padding."""
    import torch

    order = np.argsort([len(r) for r in data.ids], kind="stable")
    out = np.empty(len(data), np.float64 if regression else np.int64)
    model.eval()
    with torch.inference_mode(), _autocast(device):
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = _pad([data.ids[i] for i in idx], pad_id)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            logits = logits.float().cpu().numpy()
            out[idx] = logits[:, 0] if regression else logits.argmax(-1)
    return out


def fine_tune(
    model_factory: Callable[[], object],
    task: Task,
    train: Encoded,
    dev: dict[str, Encoded],
    spec: RunSpec,
    pad_id: int,
    device,
    on_step: Callable[[int, int, float], None] = lambda step, steps, loss: None,
) -> RunResult:
    """Trains a fresh `model_factory()` (built after seeding, so its head is the seed's) and
    scores it on every dev split."""
    import torch

    start = time.perf_counter()
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    n = min(len(train), spec.max_train_examples or len(train))
    subset = rng.permutation(len(train))[:n] if n < len(train) else np.arange(n)
    model = model_factory().to(device)
    steps = steps_for(spec, len(train))
    opt, schedule = _optimizer(model, spec, steps)
    labels = torch.as_tensor(
        train.labels, dtype=torch.float32 if task.is_regression else torch.long
    )
    losses = []
    model.train()
    lengths = np.asarray([len(train.ids[i]) for i in subset])
    for step, rows in enumerate(_batch_order(lengths, spec.batch_size, steps, rng)):
        rows = subset[rows]
        ids, mask = _pad([train.ids[i] for i in rows], pad_id)
        target = labels[rows].to(device)
        with _autocast(device):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        logits = logits.float()
        if task.is_regression:
            loss = torch.nn.functional.mse_loss(logits[:, 0], target)
        else:
            loss = torch.nn.functional.cross_entropy(logits, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"{spec.name}: training loss is {losses[-1]} at step {step}")
        on_step(step + 1, steps, losses[-1])
    by_split = {
        split: metrics.split_metrics(
            task, predict(model, data, pad_id, device, task.is_regression), data.labels
        )
        for split, data in dev.items()
    }
    tail = losses[-max(1, len(losses) // 10) :]
    return RunResult(
        spec=spec,
        metrics=by_split,
        score=metrics.task_score(task, by_split),
        steps=steps,
        train_examples=n,
        final_train_loss=float(np.mean(tail)),
        seconds=time.perf_counter() - start,
    )
