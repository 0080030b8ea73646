"""Fine-tuning steps/s at a fixed shape, for the loop before issue #63 and each change since.

`python -m maelm_jax.bench finetune` builds a random-init relative-bias export (the study's
encoder, `--finetune_encoder=LAYERSxWIDTH`) in a temp folder, so nothing is downloaded, and
trains its classifier on synthetic rows of one width; or, with `--finetune_export` and
`--finetune_task`, an export of yours on that GLUE task's train rows, ragged as fine-tuning
sees them (`finetune --quick`'s shape: `--batch_size=16 --seq_len=128`). Per variant:
steps/s, ms a step, ATen calls a step (top-level `aten::` events of the profiler: stable on
a CPU), and on CUDA the kernel launches and blocking syncs a step
(`torch.cuda.set_sync_debug_mode`'s warnings, and the profiler's synchronize and
synchronous-copy calls).

`reference_steps` and `use_reference_encoder` are the loop and the bias code as they were
(finetuning/training.py and hf/modeling.py before the change), kept to time them and to check that
the new loop's losses are theirs (tests/test_finetune.py).
"""

import json
import math
import os
import shutil
import tempfile
import time
import warnings

import numpy as np

from maelm_jax.finetuning import training
from maelm_jax.finetuning.model_slot import LoopOptions, ModelSlot
from maelm_jax.finetuning.training import Encoded, RunSpec

CHECK_EVERY = 25  # the new loop reads its loss once per this many steps: a profile window
HOST_DROPOUT = "+ host dropout masks"  # CPU only
CUDA_GRAPHS = "+ CUDA graphs"  # CUDA only
_PLAIN = {"fused_adamw": False, "first_token": False, "host_dropout": False}
VARIANTS = (  # cumulative; "today" is reference_steps; eager widths are each batch's longest
    ("today", None),
    ("no host syncs", LoopOptions(**_PLAIN, check_every=CHECK_EVERY)),
    ("+ fused AdamW", LoopOptions(**{**_PLAIN, "fused_adamw": True}, check_every=CHECK_EVERY)),
    ("+ last layer at <s> only", LoopOptions(host_dropout=False, check_every=CHECK_EVERY)),
    (HOST_DROPOUT, LoopOptions(check_every=CHECK_EVERY)),
    ("+ torch.compile", LoopOptions(compile=True, check_every=CHECK_EVERY)),  # width buckets
    (
        CUDA_GRAPHS,
        LoopOptions(compile=True, compile_mode="reduce-overhead", check_every=CHECK_EVERY),
    ),
)
_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}
_SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


# ---- the loop before issue #63, kept as it was --------------------------------------------


def use_reference_encoder(model) -> None:
    """The model as it ran before: every layer computed whole, and for the relative-bias
    class the bucket table built in every forward (a blocking host-to-device copy) and the
    float32 bias left for each layer's attention to cast."""
    import torch

    if getattr(type(model), "first_token_only", None) is not None:
        model.first_token_only = False
    encoder = model.base_model.encoder
    if not hasattr(encoder, "relative_attention_bias"):
        return
    table_list = list(model.config.relative_attention_bucket_table)

    def forward(hidden_states, positions, key_mask, first_token_only=False):
        offsets = positions[:, None, :] - positions[:, :, None] + encoder.max_positions - 1
        table = torch.tensor(table_list, dtype=torch.long, device=positions.device)
        offsets = offsets.clamp(0, table.numel() - 1)
        bias = encoder.relative_attention_bias(table[offsets]).permute(0, 3, 1, 2)
        blocked = torch.finfo(hidden_states.dtype).min
        scores_bias = bias.to(hidden_states.dtype).masked_fill(~key_mask[:, None, None, :], blocked)
        for layer in encoder.layer:
            out = layer(hidden_states, attention_mask=scores_bias)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states

    encoder.forward = forward


def reference_steps(model, task, train: Encoded, spec: RunSpec, pad_id, device, subset, rng):
    """finetuning/training.py's step loop before issue #63, a generator like `train_steps`: each
    batch padded on the host and copied, AdamW per tensor, the loss read every step."""
    import torch

    steps = training.steps_for(spec, len(train))
    opt, schedule = training._optimizer(model, spec, steps)
    labels = torch.as_tensor(
        train.labels, dtype=torch.float32 if task.is_regression else torch.long
    )
    losses = []
    model.train()
    lengths = np.asarray([len(train.ids[i]) for i in subset])
    for step, rows in enumerate(training._batch_order(lengths, spec.batch_size, steps, rng)):
        rows = subset[rows]
        ids, mask = training._pad([train.ids[i] for i in rows], pad_id)
        target = labels[rows].to(device)
        with training.autocast(device):
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
        yield step
    return np.asarray(losses)


# ---- the benchmark ------------------------------------------------------------------------


def make_export(root: str, layers: int, width: int, positions: int | None = None) -> str:
    """A random-init export of the study's MAE-LM encoder (relative bias, remote code) at
    `layers` x `width` (heads of 64), written as `python -m maelm_jax.export` lays one out;
    `positions` raises the config's positions (SQuAD's windows are 384 tokens)."""
    from configs.study import mae_lm
    from maelm_jax.config import configdict
    from maelm_jax.hf import convert, modeling

    c = mae_lm.get_config()
    c.model.num_layers, c.model.hidden_size = layers, width
    c.model.num_heads, c.model.mlp_dim = max(1, width // 64), 4 * width
    c.model.max_positions = max(c.model.max_positions, positions or 0)
    run = configdict.freeze(c)
    hf_cfg = convert.hf_config(run.model, c.vocab_size, with_lm_head=True)
    fields = {k: v for k, v in hf_cfg.items() if k not in ("auto_map", "architectures")}
    modeling.MaelmForMaskedLM(modeling.MaelmConfig(**fields)).save_pretrained(root)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=1)
    here = os.path.dirname(os.path.abspath(modeling.__file__))
    shutil.copyfile(os.path.join(here, "modeling.py"), os.path.join(root, "modeling_maelm.py"))
    return root


def _rows(n: int, width: int, vocab: int) -> Encoded:
    """`<s> ... </s>` rows of exactly `width` tokens, labels 0/1."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, vocab, (n, width))
    ids[:, 0], ids[:, -1] = 0, 2
    return Encoded(list(ids), rng.integers(0, 2, n))


def _profile_counts(steps, window: int, cuda: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(window):
            next(steps)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    aten = sum(
        1
        for e in events
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )
    out = {"aten_calls_per_step": aten / window}
    if cuda:
        out["kernel_launches_per_step"] = sum(e.name in _LAUNCHES for e in events) / window
        out["sync_calls_per_step"] = sum(e.name in _SYNCS for e in events) / window
    return out


def _sync_warnings(steps, window: int) -> float:
    """Blocking syncs a step as `torch.cuda.set_sync_debug_mode("warn")` counts them."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(window):
                next(steps)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught) / window


def _variant(export_dir, options, data, spec, device):
    """The variant's step generator (its model built and seeded first), and its slot."""
    import torch

    from maelm_jax.glue import classifier, tasks

    task = tasks.TASKS["sst2"]
    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    subset = np.arange(len(data))
    model = classifier.classifier(export_dir, 2, "pretrained", spec.dropout, spec.dropout)
    if options is None:
        use_reference_encoder(model)
        model = model.to(device)
        return reference_steps(model, task, data, spec, 1, device, subset, rng), None
    slot = ModelSlot(device, options)
    slot.load(model)
    on_device = training.to_device(data, 1, device, regression=False)
    return training.train_steps(slot, task, on_device, spec, subset, rng), slot


def _timed(steps, count: int, cuda: bool) -> float:
    import torch

    start = time.perf_counter()
    for _ in range(count):
        next(steps)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _summary(seconds: list[float], timed: int) -> dict:
    rates = sorted(timed / s for s in seconds)
    median = float(np.median(rates))
    return {"steps_per_s": median, "ms_per_step": 1000 / median,
            "steps_per_s_low": rates[0], "steps_per_s_high": rates[-1]}  # fmt: skip


def measure(
    shape: dict,
    export_dir: str | None,
    data: Encoded | None,
    timed: int,
    rounds: int,
    compile_: bool,
    on_row=lambda name, row: None,
):
    """{"shape": ..., "variants": {name: row}}, each row also handed to `on_row` when done.
    `shape`: layers, width (a random-init export built when `export_dir` is None), batch,
    seq_len (synthetic rows of that width when `data` is None). Each variant is warmed, then
    timed for `timed` steps in each of `rounds` rounds that take the variants in turn (a
    noisy machine slows them alike); a row holds the median round's rate, the slowest and
    the fastest. `compile_` adds the torch.compile variant."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    warm = 10 if cuda else 3
    spec = RunSpec(
        task="sst2", init="pretrained", learning_rate=1e-4, batch_size=shape["batch"], seed=1,
        epochs=1e6, max_steps=warm + rounds * timed + 2 * CHECK_EVERY, warmup_ratio=0.06,
        weight_decay=0.1, dropout=0.1, attention_dropout=0.1, max_seq_length=shape["seq_len"],
        max_train_examples=0,
    )  # fmt: skip
    shape = {**shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
             "threads": torch.get_num_threads(), "torch": torch.__version__}  # fmt: skip
    result = {"shape": shape, "variants": {}}
    chosen = [
        (name, options)
        for name, options in VARIANTS
        if not (options is not None and options.compile and not compile_)
        and not (cuda and name == HOST_DROPOUT)  # a CPU-only change: the same step on CUDA
        and not (not cuda and name == CUDA_GRAPHS)
    ]
    with tempfile.TemporaryDirectory(prefix="maelm_finetune_bench_") as root:
        if export_dir is None:
            export_dir = make_export(root, shape["layers"], shape["width"])
        if data is None:
            with open(os.path.join(export_dir, "config.json")) as f:
                vocab = json.load(f)["vocab_size"]
            data = _rows(64 * shape["batch"], shape["seq_len"], vocab)
        live, rows, seconds = {}, {}, {}
        for name, options in chosen:
            try:
                steps, slot = _variant(export_dir, options, data, spec, device)
                rows[name] = {"warmup_s": _timed(steps, warm, cuda)}
                live[name], seconds[name] = (steps, slot), []
            except Exception as e:  # one failed variant must not cost the others' numbers
                rows[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        for _ in range(rounds):
            for name, (steps, _) in live.items():
                seconds[name].append(_timed(steps, timed, cuda))
        for name, options in chosen:
            if name in live:
                steps, slot = live.pop(name)
                rows[name].update(_summary(seconds[name], timed))
                rows[name].update(_profile_counts(steps, CHECK_EVERY, cuda))
                if cuda:
                    rows[name]["blocking_syncs_per_step"] = _sync_warnings(steps, CHECK_EVERY)
                if options is not None and options.compile:
                    rows[name]["compiled"] = slot.compile_error is None
                    rows[name]["compile_error"] = slot.compile_error
                del steps, slot
            result["variants"][name] = rows[name]
            on_row(name, rows[name])
    return result


def task_rows(export_dir: str, task_name: str, seq_len: int, glue_dir, tfds_data_dir) -> Encoded:
    """A GLUE task's train split as the export's tokenizer cuts it (ragged, as fine-tuning
    sees it)."""
    from maelm_jax.glue import classifier, readers, tasks

    task = tasks.resolve(task_name)[0]
    examples = readers.read(task, "train", glue_dir, tfds_data_dir)
    return training.encode(classifier.tokenizer(export_dir), examples, seq_len)


def format_row(name: str, row: dict, base: dict | None) -> str:
    if "error" in row:
        return f"{name:<26} failed: {row['error']}"
    speedup = row["steps_per_s"] / base["steps_per_s"] if base and "steps_per_s" in base else 1
    text = (
        f"{name:<26} {row['steps_per_s']:8.2f} steps/s "
        f"({row['steps_per_s_low']:.2f}-{row['steps_per_s_high']:.2f}) "
        f"{row['ms_per_step']:8.2f} ms  x{speedup:5.2f}  "
        f"{row['aten_calls_per_step']:7.0f} ATen calls/step"
    )
    if "kernel_launches_per_step" in row:
        text += (
            f"  {row['kernel_launches_per_step']:6.0f} launches/step"
            f"  {row['blocking_syncs_per_step']:5.2f} syncs/step (debug mode)"
            f"  {row['sync_calls_per_step']:5.2f} (profiler)"
        )
    if "compiled" in row and not row["compiled"]:
        text += f"  [torch.compile failed, ran eagerly: {row['compile_error']}]"
    return text


def header(shape: dict) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in shape.items())
    return f"fine-tuning step (steps/s: median round, slowest-fastest): {fields}"
