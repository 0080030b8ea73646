"""GLUE fine-tuning of real exports in PyTorch (`maelm_jax.finetune`, `maelm_jax/glue/`).

The exports are the session's tiny checkpoints (conftest.py) exported in-process; the GLUE
data are small files in GLUE's own layout that each test writes, learnable (label 1 iff the
word TARGET occurs) or not (the same texts with shuffled labels).
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from process_runs import process_env
from tiny_configs import REPO_ROOT
from transformers import AutoModel, AutoModelForSequenceClassification

from maelm_jax.benchmarks import finetune_speed
from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import model_slot, search, training
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.glue import classifier, tasks
from maelm_jax.glue.readers import Example
from maelm_jax.hf import export

# Toy models run faster on one thread, and the suite's two workers share two cores.
torch.set_num_threads(1)

NOUNS = ("river", "stone", "garden", "window", "letter", "morning", "harbor", "road")
TARGET = "lantern"
RECIPE = Recipe(
    learning_rates=(1e-3,), batch_sizes=(16,), seeds=(1,), epochs=8.0, max_seq_length=32,
    dropout=0.0, attention_dropout=0.0,
)  # fmt: skip


def sentences(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Label 1 iff the sentence opens with TARGET: a signal next to `<s>`, which a 2-layer
    toy model picks up in a hundred steps."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(NOUNS, rng.integers(3, 7)))
        if i % 2:
            words[0] = TARGET
        texts.append(" ".join(words) + " .")
        labels.append(i % 2)
    return texts, labels


def write_sst2(root, shuffle_labels=False, n_train=256, n_dev=64):
    """SST-2 as GLUE ships it: a header, `sentence<TAB>label`, a space before the tab."""
    (root / "SST-2").mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        texts, labels = sentences(n, seed)
        if shuffle_labels and split == "train":
            labels = list(np.random.default_rng(7).permutation(labels))
        rows = "".join(f"{t} \t{y}\n" for t, y in zip(texts, labels, strict=True))
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
    return root


@pytest.fixture(scope="module")
def exports(tiny_checkpoints, tmp_path_factory):
    """{kind: export dir}: the MLM run (RobertaForMaskedLM) and MAE-LM with the relative bias
    (MaelmModel, remote code)."""
    root = tmp_path_factory.mktemp("finetune_exports")
    return {
        kind: export.export(tiny_checkpoints[kind], root / kind).output_dir
        for kind in ("mlm", "mae_lm")
    }


def test_learns_a_learnable_task_and_not_shuffled_labels(exports, tmp_path):
    task = [tasks.TASKS["sst2"]]
    learnable = write_sst2(tmp_path / "glue")
    shuffled = write_sst2(tmp_path / "glue_shuffled", shuffle_labels=True)
    good = search.run_search(
        exports["mae_lm"], task, RECIPE, str(tmp_path / "a"), glue_dir=learnable
    )
    bad = search.run_search(exports["mae_lm"], task, RECIPE, str(tmp_path / "b"), glue_dir=shuffled)
    # dev is balanced: the majority class scores 50
    assert good["tasks"][0]["median"] >= 90, good["tasks"][0]
    assert bad["tasks"][0]["median"] <= 70, bad["tasks"][0]
    assert set(os.listdir(tmp_path / "a")) == {"spec.json", "runs", "results.json"}


@pytest.mark.parametrize("kind", ["mlm", "mae_lm"])
def test_classifier_has_the_exported_encoder_and_survives_save_reload(exports, kind, tmp_path):
    export_dir = exports[kind]
    remote = classifier.needs_remote_code(export_dir)
    assert remote == (kind == "mae_lm")
    ids = torch.tensor([[0, 10, 11, 12, 13, 2], [0, 14, 15, 2, 1, 1]])
    mask = ids != 1
    torch.manual_seed(0)
    model = classifier.classifier(export_dir, 3, "pretrained", 0.1, 0.1).eval()
    encoder = AutoModel.from_pretrained(export_dir, trust_remote_code=remote).eval()
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        want = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        logits = model(input_ids=ids, attention_mask=mask).logits
    valid = mask.numpy()
    np.testing.assert_allclose(hidden.numpy()[valid], want.numpy()[valid], atol=1e-5)
    assert logits.shape == (2, 3)
    model.save_pretrained(tmp_path / "saved")
    again = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "saved", trust_remote_code=remote
    ).eval()
    with torch.no_grad():
        reloaded = again(input_ids=ids, attention_mask=mask).logits
    np.testing.assert_allclose(reloaded.numpy(), logits.numpy(), atol=1e-6)
    # The tokenizer: the export's own ids, also through the plain class (no remote code).
    from transformers import PreTrainedTokenizerFast

    pair = ("the river .", "a lantern !")
    want_ids = PreTrainedTokenizerFast.from_pretrained(export_dir)(*pair)["input_ids"]
    assert classifier.tokenizer(export_dir)(*pair)["input_ids"] == want_ids
    assert want_ids[0] == 0 and want_ids.count(2) == 3  # <s> A </s></s> B </s>
    # The control row: the same architecture with none of the export's weights.
    torch.manual_seed(0)
    fresh = classifier.classifier(export_dir, 3, "random", 0.1, 0.1).eval()
    assert type(fresh) is type(model)
    with torch.no_grad():
        fresh_hidden = fresh.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert np.abs(fresh_hidden.numpy() - want.numpy())[valid].mean() > 0.1


def test_dropout_is_the_recipes_not_the_exports(exports):
    with open(os.path.join(exports["mlm"], "config.json")) as f:
        assert json.load(f)["hidden_dropout_prob"] != 0.3
    model = classifier.classifier(exports["mlm"], 2, "pretrained", 0.3, 0.2)
    assert model.config.hidden_dropout_prob == 0.3
    assert model.config.attention_probs_dropout_prob == 0.2


def test_a_killed_search_resumes_run_by_run_and_refuses_another_spec(exports, tmp_path):
    glue = write_sst2(tmp_path / "glue", n_train=64, n_dev=32)
    recipe = dataclasses.replace(RECIPE, seeds=(1, 2), epochs=2.0)
    task = [tasks.TASKS["sst2"]]
    out = tmp_path / "out"
    first = search.run_search(exports["mlm"], task, recipe, str(out), glue_dir=glue)
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 2
    # As if killed after the first run: the second run's record and the results are gone.
    kept = runs[0].stat().st_mtime_ns
    runs[1].unlink()
    (out / "results.json").unlink()
    again = search.run_search(exports["mlm"], task, recipe, str(out), glue_dir=glue)
    assert runs[0].stat().st_mtime_ns == kept  # reused, not rerun
    assert again["tasks"][0]["scores"] == first["tasks"][0]["scores"]  # the rerun is exact
    written = {p: p.stat().st_mtime_ns for p in (out / "spec.json", out / "results.json")}
    with pytest.raises(ConfigError, match=r"learning_rates: \[0.001\] -> \[0.0005\]\)"):
        search.run_search(
            exports["mlm"], task, dataclasses.replace(recipe, learning_rates=(5e-4,)), str(out),
            glue_dir=glue,
        )  # fmt: skip
    compiled = model_slot.LoopOptions(compile=True)  # other masks, other widths: other runs
    with pytest.raises(ConfigError, match=r'loop\.compile: "none" -> "default"'):
        search.run_search(exports["mlm"], task, recipe, str(out), glue_dir=glue, options=compiled)
    assert {p: p.stat().st_mtime_ns for p in written} == written  # refusals write nothing


def test_regression_task_gets_a_one_output_head_and_correlations(exports, tmp_path):
    """STS-B in its 10-column layout, scored 5 when the first sentence opens with TARGET."""
    (tmp_path / "STS-B").mkdir()
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    for split, n, seed in (("train", 128, 0), ("dev", 48, 1)):
        texts, _ = sentences(2 * n, seed)
        rows = []
        for i in range(n):
            a, b = texts[2 * i + i % 2], texts[2 * i + 1 - i % 2]  # half of them open with it
            score = 5.0 * a.startswith(TARGET)
            rows.append(f"{i}\tmain\tx\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score:.3f}\n")
        (tmp_path / "STS-B" / f"{split}.tsv").write_text(header + "".join(rows))
    recipe = dataclasses.replace(RECIPE, epochs=20.0, learning_rates=(3e-3,))
    result = search.run_search(
        exports["mae_lm"], [tasks.TASKS["stsb"]], recipe, str(tmp_path / "out"), glue_dir=tmp_path
    )
    row = result["tasks"][0]
    assert set(row["metric_medians"]["dev"]) == {"pearson", "spearman"}
    assert row["median"] > 50, row


@pytest.mark.parametrize("buckets", [False, True], ids=["eager_widths", "bucketed"])
@pytest.mark.parametrize("kind", ["mlm", "mae_lm"])
def test_the_loop_computes_the_losses_of_the_loop_before_it(exports, kind, buckets):
    """With dropout 0 the first 100 losses of `train_steps` (split on the device, widths
    each batch's longest or in buckets, fused AdamW, the last layer at `<s>` alone, the bias
    table a buffer) are those of the loop before them (`finetune_speed.reference_steps`) to
    float32 rounding."""
    export_dir = exports[kind]
    tok = classifier.tokenizer(export_dir)
    texts, labels = sentences(512, 0)
    examples = [Example(t, None, y) for t, y in zip(texts, labels, strict=True)]
    data = training.encode(tok, examples, 32)
    assert len({len(r) for r in data.ids}) > 2  # ragged: the widths vary
    spec = dataclasses.replace(RECIPE, max_steps=100).runs("sst2", "pretrained", 32)[0]
    task, cpu, subset = tasks.TASKS["sst2"], torch.device("cpu"), np.arange(len(data))

    torch.manual_seed(spec.seed)
    model = classifier.classifier(export_dir, 2, "pretrained", 0.0, 0.0)
    finetune_speed.use_reference_encoder(model)
    old = finetune_speed.reference_steps(
        model, task, data, spec, tok.pad_token_id, cpu, subset, np.random.default_rng(spec.seed)
    )
    torch.manual_seed(spec.seed)
    slot = model_slot.ModelSlot(cpu, model_slot.LoopOptions(width_buckets=buckets))
    slot.load(classifier.classifier(export_dir, 2, "pretrained", 0.0, 0.0))
    on_device = training.to_device(data, tok.pad_token_id, cpu, regression=False)
    new = training.train_steps(
        slot, task, on_device, spec, subset, np.random.default_rng(spec.seed)
    )
    want, got = training._drain(old), training._drain(new)
    assert len(want) == len(got) == 100
    assert abs(want[-10:].mean() - want[:10].mean()) > 0.02  # they move: the check says something
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def test_a_search_refuses_to_resume_where_it_did_not_compute(exports, tmp_path):
    glue = write_sst2(tmp_path / "glue", n_train=32, n_dev=16)
    recipe = dataclasses.replace(RECIPE, epochs=1.0)
    task, out = [tasks.TASKS["sst2"]], tmp_path / "out"
    search.run_search(exports["mlm"], task, recipe, str(out), glue_dir=glue)
    with open(out / "spec.json") as f:
        spec = json.load(f)
    assert spec["compute"] == {"device": "cpu", "precision": "float32"}
    spec["compute"] = search.compute_identity(torch.device("cuda"))
    with open(out / "spec.json", "w") as f:
        json.dump(spec, f)
    (out / "results.json").unlink()
    with pytest.raises(ConfigError, match=r"device=cuda, precision=bf16-autocast.*device=cpu"):
        search.run_search(exports["mlm"], task, recipe, str(out), glue_dir=glue)


def _finetune(*args, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "maelm_jax.finetune", *args],
        cwd=REPO_ROOT,
        env={**process_env(1), "OMP_NUM_THREADS": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_command_exports_a_workdir_and_prints_the_table(tiny_checkpoints, tmp_path):
    glue = write_sst2(tmp_path / "glue", n_train=64, n_dev=32)
    out = tmp_path / "out"
    done = _finetune(
        f"--workdir={tiny_checkpoints['mlm']}", f"--output_dir={out}", "--tasks=sst2",
        f"--glue_dir={glue}", "--quick", "--max_steps=8", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["tasks"][0]["task"] == "sst2" and len(result["tasks"][0]["scores"]) == 1
    exported = [n for n in os.listdir(out) if n.startswith("export-step")]
    assert exported == ["export-step3"]
    assert result["export"]["path"] == str(out / "export-step3")
    assert "ETA" in done.stderr  # progress


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("unknown_task", "unknown task 'wnli'"),
        ("not_an_export", "not a HuggingFace export"),
        ("no_checkpoint", "has no checkpoints/ directory"),
        ("missing_file", "SST-2/dev.tsv"),
        ("bad_label", "'positive'"),
        ("wrong_columns", "line 3"),
        ("bad_seeds", "--seeds=one: give integers, comma-separated (e.g. --seeds=1,2,3)"),
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing_to_trust(exports, case, expect, tmp_path):
    glue = write_sst2(tmp_path / "glue", n_train=16, n_dev=8)
    args = [f"--export={exports['mlm']}", "--tasks=sst2", f"--glue_dir={glue}"]
    if case == "unknown_task":
        args[1] = "--tasks=sst2,wnli"
    elif case == "not_an_export":
        args[0] = f"--export={tmp_path}"
    elif case == "no_checkpoint":
        args[0] = f"--workdir={tmp_path / 'glue'}"
    elif case == "missing_file":
        (glue / "SST-2" / "dev.tsv").unlink()
    elif case == "bad_label":
        path = glue / "SST-2" / "train.tsv"
        path.write_text(path.read_text().replace("\t1\n", "\tpositive\n", 1))
    elif case == "wrong_columns":
        path = glue / "SST-2" / "dev.tsv"
        lines = path.read_text().splitlines(keepends=True)
        lines[2] = lines[2].replace("\t", " ")
        path.write_text("".join(lines))
    elif case == "bad_seeds":
        args.append("--seeds=one")
    out = tmp_path / "out"
    done = _finetune(*args, f"--output_dir={out}", timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("maelm_jax.finetune: error:") and expect in last, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not out.exists() or not {"spec.json", "results.json"} & set(os.listdir(out))


def test_a_compiled_model_trains_as_the_eager_one(exports):
    """`finetune --compile=default`: the model really compiles, whole (no graph break, no
    frame left eager at the recompile limit: Dynamo falls back silently on both), into at
    most one graph per width bucket, and with dropout 0 its losses are the eager model's to
    float rounding."""
    from torch._dynamo.utils import counters

    export_dir = exports["mae_lm"]
    tok = classifier.tokenizer(export_dir)
    texts, labels = sentences(256, 0)
    examples = [Example(t, None, y) for t, y in zip(texts, labels, strict=True)]
    data = training.encode(tok, examples, 32)
    spec = dataclasses.replace(RECIPE, max_steps=30).runs("sst2", "pretrained", 32)[0]
    task, cpu, subset = tasks.TASKS["sst2"], torch.device("cpu"), np.arange(len(data))
    longest = max(len(r) for r in data.ids)
    buckets = {training.bucket_width(len(r), longest) for r in data.ids}  # a batch's is one
    assert len(buckets) > 1  # more than one shape: recompiles happen
    losses, slots = {}, {}
    for name, options in (
        ("eager", model_slot.LoopOptions(width_buckets=True)),
        ("compiled", model_slot.LoopOptions(compile=True)),
    ):
        torch.manual_seed(spec.seed)
        slots[name] = slot = model_slot.ModelSlot(cpu, options)
        slot.load(classifier.classifier(export_dir, 2, "pretrained", 0.0, 0.0))
        on_device = training.to_device(data, tok.pad_token_id, cpu, regression=False)
        steps = training.train_steps(
            slot, task, on_device, spec, subset, np.random.default_rng(spec.seed)
        )
        counters.clear()
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            losses[name] = training._drain(steps)
    assert slots["compiled"].compile_error is None
    assert slots["compiled"].step_model is not slots["compiled"].model and slots["compiled"].buckets
    assert not counters["graph_break"] and not counters["unimplemented"], dict(counters)
    assert counters["frames"]["ok"] == counters["frames"]["total"] > 0, dict(counters["frames"])
    assert 1 <= counters["stats"]["unique_graphs"] <= len(buckets), dict(counters["stats"])
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-3, atol=1e-4)


def _two_compiled_steps(exports):
    """(export, tokenizer, 64 encoded SST-2-like rows, a 2-step run) for the compile tests."""
    export_dir = exports["mae_lm"]
    tok = classifier.tokenizer(export_dir)
    texts, labels = sentences(64, 0)
    data = training.encode(
        tok, [Example(t, None, y) for t, y in zip(texts, labels, strict=True)], 32
    )
    spec = dataclasses.replace(RECIPE, max_steps=2).runs("sst2", "pretrained", 32)[0]
    return export_dir, tok, data, spec


def test_a_model_bug_under_compile_raises_instead_of_training_eagerly(exports):
    """A shape error in the model's own code is not torch.compile failing: it propagates
    from the first compiled step (as Dynamo's TorchRuntimeError), with no eager fallback."""
    export_dir, tok, data, spec = _two_compiled_steps(exports)
    cpu = torch.device("cpu")
    slot = model_slot.ModelSlot(cpu, model_slot.LoopOptions(compile=True))
    model = classifier.classifier(export_dir, 2, "pretrained", 0.0, 0.0)
    hidden = model.config.hidden_size
    model.classifier.out_proj = torch.nn.Linear(hidden + 1, 2)  # the bug: one input too many
    slot.load(model)
    on_device = training.to_device(data, tok.pad_token_id, cpu, regression=False)
    steps = training.train_steps(
        slot, tasks.TASKS["sst2"], on_device, spec, np.arange(len(data)), np.random.default_rng(1)
    )
    try:
        with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=str(hidden + 1)):
            training._drain(steps)
    finally:
        torch._dynamo.reset()
    assert slot.compile_error is None and slot.step_model is not slot.model  # no fallback


def test_a_compile_that_fails_trains_eagerly_with_one_warning(exports, caplog):
    """torch.compile failing for want of a working C++ compiler (Inductor's InductorError) is
    what the eager fallback is for: the run trains on, and one warning names the error."""
    import torch._inductor.config as inductor_config

    export_dir, tok, data, spec = _two_compiled_steps(exports)
    cpu = torch.device("cpu")
    slot = model_slot.ModelSlot(cpu, model_slot.LoopOptions(compile=True))
    slot.load(classifier.classifier(export_dir, 2, "pretrained", 0.0, 0.0))
    on_device = training.to_device(data, tok.pad_token_id, cpu, regression=False)
    steps = training.train_steps(
        slot, tasks.TASKS["sst2"], on_device, spec, np.arange(len(data)), np.random.default_rng(1)
    )
    no_compiler = {"cpp.cxx": ("/nonexistent/c++",), "force_disable_caches": True}
    try:
        with inductor_config.patch(no_compiler), caplog.at_level("WARNING", logger="absl"):
            losses = training._drain(steps)
    finally:
        torch._dynamo.reset()  # nothing of the failed compile reaches a later test
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert slot.step_model is slot.model and "InvalidCxxCompiler" in slot.compile_error
    warned = [r.getMessage() for r in caplog.records if "torch.compile failed" in r.getMessage()]
    assert len(warned) == 1 and "InvalidCxxCompiler" in warned[0], warned
