"""SQuAD fine-tuning speed: this project's loop against transformers' `Trainer`, in one run.

`python -m maelm_jax.bench finetune --finetune_task=squad_v2` (or squad_v1) trains the same
export's question-answering model (hf/task_model.py), built from the same seed, on the same
batches of 384-token windows in the same order, two ways: `finetuning/training.py`'s
`train_steps` as `finetune` runs it, and a real `transformers.Trainer` (TrainingArguments
with the same learning rate, batch, steps, warmup, AdamW betas, eps and weight decay, no
gradient clipping, as the recipe has none; no evaluation, no saving, `report_to=[]`) whose
dataloader reads the same window tensors, each batch cut to its longest window as our loop
cuts it. Windows are synthetic (random ids of exactly 384 tokens, answers inside the context
part, a third unanswerable) unless `--squad_dir` gives SQuAD's files, whose train windows
squad/features.py builds with `--finetune_export`'s tokenizer (real windows are often
shorter than 384, so a step computes less than its tokens/s, batch x 384 a step, counts).

The loops are timed in interleaved rounds (`finetune_speed.measure`'s pattern): `Trainer.train`
runs in a thread that a callback holds after each optimizer step, so each loop is a generator
of steps that the same timer drives. Each row also keeps its first steps' losses: at dropout 0
the first is the same number for both, which a different model, batch or label would break.
"""

import os
import tempfile
import threading

import numpy as np

from maelm_jax.benchmarks import finetune_speed
from maelm_jax.finetuning import recipe, training
from maelm_jax.finetuning.model_slot import LoopOptions, ModelSlot
from maelm_jax.finetuning.training import DeviceSplit, RunSpec

OURS = "ours (finetuning/training.py)"
OURS_COMPILED = "ours + torch.compile"
TRAINER = "transformers Trainer"
LOSSES_KEPT = 3  # the first steps' losses each row reports


def synthetic_windows(n: int, seq_len: int, vocab: int, seed: int = 0) -> dict:
    """`<s> question </s></s> context </s>` windows of exactly `seq_len` tokens (random ids),
    start <= end inside the context (at most 30 tokens apart), a third pointing at `<s>`."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (n, seq_len))
    question = rng.integers(4, 65, n)  # where the question's </s></s> start
    context = question + 2
    ids[:, 0], ids[:, -1] = 0, 2
    ids[np.arange(n), question] = ids[np.arange(n), question + 1] = 2
    start = rng.integers(context, seq_len - 1)
    end = np.minimum(start + rng.integers(0, 30, n), seq_len - 2)
    unanswerable = rng.random(n) < 1 / 3
    start[unanswerable] = end[unanswerable] = 0
    return {"ids": ids.astype(np.int64), "labels": np.stack([start, end], 1).astype(np.int64),
            "pad_id": 1}  # fmt: skip


def real_windows(export_dir: str, task_name: str, squad_dir: str, seq_len: int) -> dict:
    """SQuAD's train windows as `finetune` builds them (squad/features.py)."""
    from maelm_jax.hf import task_model
    from maelm_jax.squad import features, reading

    version = reading.VERSIONS[task_name]
    examples = reading.read(version, "train", squad_dir, None)
    tokenizer = task_model.tokenizer(export_dir)
    stride = features.window_shape(task_model.max_positions(export_dir), seq_len)[1]
    windows = features.build(examples, tokenizer, seq_len, stride)
    labels = np.stack([windows.start_positions, windows.end_positions], 1)
    return {"ids": windows.input_ids.astype(np.int64), "labels": labels.astype(np.int64),
            "pad_id": tokenizer.pad_token_id}  # fmt: skip


def _task(task_name: str):
    from maelm_jax.finetuning.squad_runs import SquadTask
    from maelm_jax.squad import reading

    return SquadTask(reading.VERSIONS[task_name], recipe.SQUAD)


def _model(export_dir: str, spec: RunSpec):
    import torch

    from maelm_jax.hf import task_model

    torch.manual_seed(spec.seed)
    return task_model.load_for_question_answering(
        export_dir, "pretrained", spec.dropout, spec.attention_dropout
    )


def _keep_losses(model, losses: list) -> None:
    """The first `LOSSES_KEPT` training losses of `model`'s forward calls, left on the device."""

    def hook(module, args, out):
        if module.training and len(losses) < LOSSES_KEPT and out.loss is not None:
            losses.append(out.loss.detach())

    model.register_forward_hook(hook)


def _ours(export_dir, windows, spec, task, device, options, losses):
    from maelm_jax.finetuning.training import upload

    ids, labels = windows["ids"], windows["labels"]
    lengths = (ids != windows["pad_id"]).sum(1)
    lengths = np.maximum(lengths, 1)
    split = DeviceSplit(upload(ids[:, : lengths.max()], device), upload(labels, device),
                        lengths, windows["pad_id"])  # fmt: skip
    slot = ModelSlot(device, options)
    model, _ = slot.load(_model(export_dir, spec))
    _keep_losses(model, losses)
    rng = np.random.default_rng(spec.seed)
    return training.train_steps(slot, task, split, spec, np.arange(len(split)), rng), slot


def _order(windows, spec: RunSpec) -> list[np.ndarray]:
    """The batches our loop draws for `spec` (its `_batch_order` from the same seed)."""
    lengths = np.maximum((windows["ids"] != windows["pad_id"]).sum(1), 1)
    steps = training.steps_for(spec, len(lengths))
    rng = np.random.default_rng(spec.seed)
    return list(training._batch_order(lengths, spec.batch_size, steps, rng))


def _trainer_steps(export_dir, windows, spec, device, root, losses):
    """transformers' Trainer on the same model and batches, a generator of its steps."""
    import torch
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    ids = torch.as_tensor(windows["ids"])
    mask = (ids != windows["pad_id"]).long()
    labels = torch.as_tensor(windows["labels"])
    order = _order(windows, spec)

    class Ordered(torch.utils.data.IterableDataset):
        def __iter__(self):
            for rows in order:
                for r in rows:
                    yield {
                        "input_ids": ids[r],
                        "attention_mask": mask[r],
                        "start_positions": labels[r, 0],
                        "end_positions": labels[r, 1],
                    }

    go, done = threading.Semaphore(0), threading.Semaphore(0)
    state = {"stop": False, "error": None}

    class Pace(TrainerCallback):
        """Holds the Trainer after each optimizer step until the timer asks for the next."""

        def on_step_end(self, args, trainer_state, control, **kwargs):
            done.release()
            go.acquire()
            if state["stop"]:
                control.should_training_stop = True

    model = _model(export_dir, spec)
    _keep_losses(model, losses)
    cuda = device.type == "cuda"
    args = TrainingArguments(
        output_dir=os.path.join(root, "trainer"), per_device_train_batch_size=spec.batch_size,
        max_steps=len(order), learning_rate=spec.learning_rate,
        warmup_steps=int(spec.warmup_ratio * len(order)), lr_scheduler_type="linear",
        weight_decay=spec.weight_decay, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6,
        max_grad_norm=0.0, eval_strategy="no", save_strategy="no", logging_strategy="no",
        report_to=[], disable_tqdm=True, seed=spec.seed, bf16=cuda, use_cpu=not cuda,
        dataloader_num_workers=0,
    )  # fmt: skip

    def collate(rows: list[dict]) -> dict:
        """A batch cut to its longest window, as our loop cuts it (and as `run_qa.py` pads
        without --pad_to_max_length): the same widths, so the same work and losses."""
        batch = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
        width = int(batch["attention_mask"].sum(1).max())
        for key in ("input_ids", "attention_mask"):
            batch[key] = batch[key][:, :width]
        return batch

    trainer = Trainer(
        model=model, args=args, train_dataset=Ordered(), data_collator=collate, callbacks=[Pace()]
    )
    trainer.remove_callback(PrinterCallback)  # its end-of-run summary would end up on stdout
    threads = torch.get_num_threads()

    def run():
        torch.set_num_threads(threads)  # a new thread starts at OpenMP's default
        go.acquire()
        try:
            trainer.train()
        except BaseException as e:  # handed to the timer's thread
            state["error"] = e
        finally:
            state["stop"] = True
            done.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        for step in range(len(order)):
            go.release()
            done.acquire()
            if state["error"] is not None:
                raise state["error"]
            if state["stop"]:
                return
            yield step
    finally:
        state["stop"] = True
        go.release()
        thread.join()


def measure(
    shape: dict,
    export_dir: str | None,
    windows: dict | None,
    timed: int,
    rounds: int,
    compile_: bool,
    dropout: float,
    on_row=lambda name, row: None,
) -> dict:
    """{"shape": ..., "loops": {name: row}}: `shape` holds layers, width (a random-init export
    is built when `export_dir` is None), batch, seq_len, rows (the task name); `windows`
    (synthetic when None): ids [n, seq_len], labels [n, 2], pad_id. Each loop is warmed, then
    timed for `timed` steps in each of `rounds` rounds that take the loops in turn; a row holds
    the median round's steps/s and tokens/s, the slowest and fastest, and its first losses."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    warm = 10 if cuda else 2
    task = _task(shape["rows"])
    spec = RunSpec(
        task=task.name, init="pretrained", learning_rate=1e-4, batch_size=shape["batch"],
        seed=1, epochs=1e6, max_steps=warm + rounds * timed, warmup_ratio=0.1,
        weight_decay=0.01, dropout=dropout, attention_dropout=dropout,
        max_seq_length=shape["seq_len"], max_train_examples=0,
    )  # fmt: skip
    shape = {**shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
             "threads": torch.get_num_threads(), "torch": torch.__version__,
             "dropout": dropout}  # fmt: skip
    tokens = shape["batch"] * shape["seq_len"]
    result = {"shape": shape, "loops": {}}
    with tempfile.TemporaryDirectory(prefix="maelm_squad_bench_") as root:
        if export_dir is None:
            export_dir = finetune_speed.make_export(
                root, shape["layers"], shape["width"], positions=shape["seq_len"]
            )
        if windows is None:
            vocab = _vocab(export_dir)
            windows = synthetic_windows(16 * shape["batch"], shape["seq_len"], vocab)
        loops = [(OURS, LoopOptions(check_every=finetune_speed.CHECK_EVERY))]
        if compile_:
            options = LoopOptions(compile=True, check_every=finetune_speed.CHECK_EVERY)
            loops.append((OURS_COMPILED, options))
        loops.append((TRAINER, None))
        live, rows, seconds, losses = {}, {}, {}, {}
        for name, options in loops:
            losses[name] = []
            try:
                if options is None:
                    steps = _trainer_steps(export_dir, windows, spec, device, root, losses[name])
                else:
                    steps, _ = _ours(export_dir, windows, spec, task, device, options,
                                     losses[name])  # fmt: skip
                rows[name] = {"warmup_s": finetune_speed._timed(steps, warm, cuda)}
                live[name], seconds[name] = steps, []
            except Exception as e:  # one failed loop must not cost the other's numbers
                rows[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        for _ in range(rounds):
            for name, steps in live.items():
                seconds[name].append(finetune_speed._timed(steps, timed, cuda))
        for name, _ in loops:
            if name in live:
                live.pop(name).close()
                row = rows[name]
                row.update(finetune_speed._summary(seconds[name], timed))
                row["tokens_per_step"] = tokens
                for key in ("", "_low", "_high"):
                    row[f"tokens_per_s{key}"] = row[f"steps_per_s{key}"] * tokens
                row["first_losses"] = [float(v) for v in losses[name]]
            result["loops"][name] = rows[name]
            on_row(name, rows[name])
    return result


def _vocab(export_dir: str) -> int:
    from maelm_jax.hf import task_model

    return int(task_model.export_config(export_dir)["vocab_size"])


def format_row(name: str, row: dict, base: dict | None) -> str:
    if "error" in row:
        return f"{name:<30} failed: {row['error']}"
    ratio = row["tokens_per_s"] / base["tokens_per_s"] if base and "tokens_per_s" in base else 1
    losses = ", ".join(f"{v:.4f}" for v in row["first_losses"])
    return (
        f"{name:<30} {row['steps_per_s']:7.3f} steps/s {row['tokens_per_s']:9.0f} tokens/s "
        f"({row['tokens_per_s_low']:.0f}-{row['tokens_per_s_high']:.0f}) "
        f"{row['ms_per_step']:8.1f} ms  x{ratio:5.2f}  first losses {losses}"
    )


def header(shape: dict) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in shape.items())
    return f"SQuAD fine-tuning step (tokens/s: median round, slowest-fastest): {fields}"
