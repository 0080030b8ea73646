"""One fine-tuning run: a task, a learning rate, a batch size, a seed -> dev metrics.

RoBERTa's recipe (fairseq `README.glue.md`; COCO-LM's SQuAD recipe is the same loop): AdamW
with betas (0.9, 0.98), eps 1e-6 and decoupled weight decay (not on biases and LayerNorm
weights, as transformers' Trainer excludes them), linear warmup over the first `warmup_ratio`
of the steps and linear decay to zero, no gradient clipping. The loss is the task's: GLUE's
cross-entropy (MSE for STS-B's regression) on the `<s>` head, or a family's own `loss`
(SQuAD's span loss, squad_runs.py); so is the evaluation (`fine_tune`'s `evaluate`).
The data order and the head's initialisation come from the seed alone, so a rerun with the
same seed draws the same batches and the same head. The score is the model's after the last
step (no checkpoint picked on the dev set it is scored on).
"""

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from maelm_jax.finetuning.model_slot import ModelSlot, compile_failed
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


def _pad(rows: list[np.ndarray], pad_id: int, width: int | None = None):
    import torch

    width = width or max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    ids = torch.from_numpy(ids)
    return ids, ids != pad_id


def bucket_width(width: int, limit: int) -> int:
    """`width` rounded up to 8, 16, 24, 32, 48, 64, 96, 128, 192, ... (at most 1.5x the
    padding, never past `limit`): a run sees a handful of shapes, so that `torch.compile` and
    CUDA graphs build a handful of programs, not one per batch."""
    bucket = 8
    while bucket < width:
        power = 1 << (bucket.bit_length() - 1)
        bucket = power * 3 // 2 if bucket == power and power >= 16 else 2 * power
    return min(bucket, limit)


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


@dataclasses.dataclass(frozen=True)
class DeviceSplit:
    """A train split on the device, padded once: ids [n, longest row], labels [n] (GLUE) or
    [n, 2] (SQuAD's start and end). The row lengths stay on the host, where each batch's width
    is chosen without reading the device."""

    ids: object
    labels: object
    lengths: np.ndarray
    pad_id: int

    def __len__(self) -> int:
        return len(self.lengths)


def upload(array, device):
    """Host -> device without blocking: a pinned copy on CUDA; on CPU, the array itself."""
    import torch

    tensor = torch.as_tensor(array)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def to_device(data: Encoded, pad_id: int, device, regression: bool) -> DeviceSplit:
    ids, _ = _pad(data.ids, pad_id)
    labels = data.labels.astype(np.float32 if regression else np.int64)
    lengths = np.asarray([len(r) for r in data.ids])
    return DeviceSplit(upload(ids, device), upload(labels, device), lengths, pad_id)


def _optimizer(model, spec: RunSpec, steps: int, fused: bool = False):
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
        **({"fused": True} if fused else {}),
    )
    warmup = int(spec.warmup_ratio * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (steps - step) / max(1, steps - warmup))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def autocast(device):
    import contextlib

    import torch

    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _loss(model, ids, mask, target, task, device):
    """The batch's mean loss: the task's own `loss(model, ids, mask, target)` where it has one
    (a family's, e.g. SQuAD's span loss), else GLUE's on the classifier's logits."""
    import torch

    own = getattr(task, "loss", None)
    with autocast(device):
        if own is not None:
            return own(model, ids, mask, target)
        logits = model(input_ids=ids, attention_mask=mask).logits
    if logits.dtype != torch.float32:  # autocast's bf16 logits; a no-op call costs a dispatch
        logits = logits.float()
    if task.is_regression:
        return torch.nn.functional.mse_loss(logits[:, 0], target)
    return torch.nn.functional.cross_entropy(logits, target)


def train_steps(
    slot: ModelSlot,
    task: Task,
    data: DeviceSplit,
    spec: RunSpec,
    subset: np.ndarray,
    rng: np.random.Generator,
    on_step: Callable[[int, int, float], None] = lambda step, steps, loss: None,
):
    """The run's steps, a generator that yields after each (the benchmark times them one by
    one) and returns the losses [steps]. Nothing in a step waits for the device: the batch is
    gathered there from `data` through an index uploaded once, its width comes from host-side
    lengths, and the loss is read every `check_every` steps (when a non-finite one raises)."""
    import torch

    device, options = slot.device, slot.options
    model = slot.model
    steps = steps_for(spec, len(data))
    fused = options.fused_adamw and device.type in ("cuda", "cpu")
    opt, schedule = _optimizer(model, spec, steps, fused)
    batches = _batch_order(data.lengths[subset], spec.batch_size, steps, rng)
    order = [subset[rows] for rows in batches]
    bounds = np.cumsum([0] + [len(rows) for rows in order])
    index = upload(np.concatenate(order), device)
    limit = data.ids.shape[1]
    pending: list = []  # the losses since the last read, on the device
    read: list[float] = []
    model.train()
    for step, rows in enumerate(order):
        idx = index[bounds[step] : bounds[step + 1]]
        width = int(data.lengths[rows].max())
        width = bucket_width(width, limit) if slot.buckets else width
        ids = data.ids[:, :width].index_select(0, idx)
        target = data.labels.index_select(0, idx)
        for attempt in (0, 1):
            try:
                opt.zero_grad(set_to_none=True)
                mask = ids != data.pad_id
                loss = _loss(slot.step_model, ids, mask, target, task, device)
                loss.backward()
                break
            except Exception as e:  # torch.compile fails at a shape's first call
                if attempt or slot.step_model is model or not compile_failed(e):
                    raise
                slot.fall_back(e)
        opt.step()
        schedule.step()
        pending.append(loss.detach())
        if (step + 1) % options.check_every == 0 or step + 1 == steps:
            chunk, pending = torch.stack(pending).tolist(), []
            for i, value in enumerate(chunk):
                if not math.isfinite(value):
                    raise FloatingPointError(
                        f"{spec.name}: training loss is {value} at step {len(read) + i}"
                    )
            read += chunk
            on_step(step + 1, steps, read[-1])
        yield step
    return np.asarray(read)


def predict(model, data: Encoded, pad_id: int, device, regression: bool, batch_size: int = 128):
    """Class ids [n] (or scores [n]) for every row, in order; rows sorted by length in
    between so that little of each batch is padding, and read back once at the end."""
    import torch

    order = np.argsort([len(r) for r in data.ids], kind="stable")
    out = np.empty(len(data), np.float64 if regression else np.int64)
    found = []
    model.eval()
    with torch.inference_mode(), autocast(device):
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = _pad([data.ids[i] for i in idx], pad_id)
            ids, mask = upload(ids, device), upload(mask, device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            found.append(logits[:, 0] if regression else logits.argmax(-1))
    if found:
        out[order] = torch.cat(found).cpu().numpy()
    return out


def _drain(steps) -> np.ndarray:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def fine_tune(
    model_factory: Callable[[], object],
    task: Task,
    train: Encoded | DeviceSplit,
    dev: dict[str, Encoded],
    spec: RunSpec,
    pad_id: int,
    device,
    on_step: Callable[[int, int, float], None] = lambda step, steps, loss: None,
    slot: ModelSlot | None = None,
    train_on_device: DeviceSplit | None = None,
    evaluate: Callable[[object], tuple[dict, float]] | None = None,
) -> RunResult:
    """Trains a fresh `model_factory()` (built after seeding, so its head is the seed's) and
    scores it: `evaluate(model)` -> (dev split -> metric -> fraction, score in points), a
    family's own; by default GLUE's metrics on every split of `dev`. A search passes one
    `slot` (the model on the device) and one `train_on_device` to all its runs of a task."""
    import torch

    start = time.perf_counter()
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    n = min(len(train), spec.max_train_examples or len(train))
    subset = rng.permutation(len(train))[:n] if n < len(train) else np.arange(n)
    slot = slot or ModelSlot(device)
    model, _ = slot.load(model_factory())
    on_device = train_on_device or to_device(train, pad_id, device, task.is_regression)
    losses = _drain(train_steps(slot, task, on_device, spec, subset, rng, on_step))
    if evaluate is None:
        by_split = {
            split: metrics.split_metrics(
                task, predict(model, data, pad_id, device, task.is_regression), data.labels
            )
            for split, data in dev.items()
        }
        score = metrics.task_score(task, by_split)
    else:
        by_split, score = evaluate(model)
    tail = losses[-max(1, len(losses) // 10) :]
    return RunResult(
        spec=spec,
        metrics=by_split,
        score=score,
        steps=len(losses),
        train_examples=n,
        final_train_loss=float(np.mean(tail)),
        seconds=time.perf_counter() - start,
    )
