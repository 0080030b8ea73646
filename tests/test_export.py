"""Export: tiny trained checkpoints -> HuggingFace directories that a fresh PyTorch process
loads offline with the same numbers, the same token ids and a working fine-tune."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from etils import epath
from tiny_configs import REPO_ROOT

from maelm_jax.checkpoints import manifest
from maelm_jax.config.run_config import ConfigError
from maelm_jax.hf import export
from maelm_jax.inspection import trained_model
from maelm_jax.model.positions.relative_bias import relative_position_buckets

EXPECTED_CLASS = {"mlm": "RobertaForMaskedLM", "mae_lm": "MaelmModel", "3ml_cross": "RobertaModel"}
SAMPLE_TEXTS = (
    "The quiet river stood near the old garden.",
    "  leading,   inner\truns\n\nand trailing whitespace  ",
    "naïve café 東京 ẞ ﬁ ① 🙂",
    "The <mask> stood near the <mask>.",
    "a<mask>b",
    "x  <mask>  y",
    "It is <mask>.",
    "<s>literal</s> tags <pad><unk>",
    "",
)
FILL_MASK_TEXT = "The old <mask> stood."  # fits the tiny models' 32 positions


@pytest.fixture(scope="module")
def exports(tiny_checkpoints, tmp_path_factory):
    """{kind: (ExportResult, TrainedModel)}: each tiny checkpoint exported in-process; the
    MAE-LM one through a file:// URL (the path layer gs:// shares)."""
    root = tmp_path_factory.mktemp("exports")
    out = {kind: root / kind for kind in tiny_checkpoints}
    out["mae_lm"] = f"file://{root / 'mae_lm'}"
    return {
        kind: (export.export(workdir, out[kind]), trained_model.load(workdir))
        for kind, workdir in tiny_checkpoints.items()
    }


@pytest.fixture(scope="module")
def reloaded(exports, tmp_path_factory):
    """What tests/hf_reload.py, a fresh offline transformers process, saw; and its inputs."""
    out = tmp_path_factory.mktemp("reloaded")
    _, mlm = exports["mlm"]
    ids = export.parity_batch(mlm)
    spec = {
        "exports": {
            kind: {
                "dir": result.output_dir,
                "remote_code": result.hf_class.startswith("Maelm"),
                "mlm": kind == "mlm",
            }
            for kind, (result, _) in exports.items()
        },
        "ids": ids.tolist(),
        "texts": SAMPLE_TEXTS,
        "fill_mask_text": FILL_MASK_TEXT,
        "fine_tune": ["mlm", "mae_lm"],
    }
    (out / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(out / "hf"))
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "hf_reload.py"), str(out / "spec.json"),
         str(out)],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text()), out, ids


def test_each_kind_exports_to_its_class_with_parity(exports):
    for kind, (result, _) in exports.items():
        assert result.hf_class == EXPECTED_CLASS[kind]
        assert result.objective == kind
        assert result.max_abs_diff_hidden <= export.TOLERANCE
        assert (result.max_abs_diff_logits is None) == (kind != "mlm")
        files = set(os.listdir(result.output_dir))
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
        assert ("modeling_maelm.py" in files) == (kind == "mae_lm")
    assert exports["mlm"][0].max_abs_diff_logits <= export.TOLERANCE


def test_fresh_process_reload_matches_jax(exports, reloaded):
    result, out, ids = reloaded
    valid = ids != 1
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    for kind, (_, trained) in exports.items():
        assert result[kind]["class"] == EXPECTED_CLASS[kind]
        jax_hidden = np.asarray(trained.encode_fn()(ids, positions))
        torch_hidden = np.load(out / f"{kind}_hidden.npy")
        assert np.abs(jax_hidden - torch_hidden)[valid].max() <= export.TOLERANCE, kind
    _, mlm = exports["mlm"]
    jax_logits = export.jax_outputs(mlm, ids, with_lm_head=True)[1]
    torch_logits = np.load(out / "mlm_logits.npy")
    assert torch_logits.shape[-1] == mlm.tokenizer.vocab_size  # padding rows cut
    assert np.abs(jax_logits - torch_logits)[valid].max() <= export.TOLERANCE


def _reference_ids(tok, text: str) -> list[int]:
    """The JAX side's query encoding (literal special strings -> their ids) in `<s> ... </s>`."""
    return [tok.bos_id, *tok.encode_query(text), tok.eos_id]


def test_tokenizer_ids_equal_the_pipelines(exports, reloaded):
    result, _, _ = reloaded
    for kind, (_, trained) in exports.items():
        tok = trained.tokenizer
        got = result[kind]
        assert got["special"] == {"bos": 0, "pad": 1, "eos": 2, "unk": 3, "mask": 4}
        for text, ids in zip(SAMPLE_TEXTS, got["token_ids"], strict=True):
            assert ids == _reference_ids(tok, text), text
    # Byte fallback reached: a character outside the tiny vocabulary became its bytes.
    cjk = result["mlm"]["token_ids"][2]
    assert any(exports["mlm"][1].tokenizer.id_to_piece(i).startswith("<0x") for i in cjk)


def test_the_tokenizer_loads_without_remote_code_or_a_prompt(reloaded):
    """`AutoTokenizer.from_pretrained(export)` with no `trust_remote_code`, as a script calls
    it: transformers reads config.json first, and a config type of its own would make it ask
    before running the export's code (a blocked script) and warn of a type mismatch. The
    relative-bias export's model class still comes from its code (`MaelmModel` above)."""
    result, _, _ = reloaded
    for kind, got in result.items():
        printed = got["tokenizer_printed"]
        for sign in ("custom code", "trust_remote_code", "You are using a model of type"):
            assert sign not in printed, (kind, printed[-2000:])
        assert got["plain_config"] == "RobertaConfig", kind
    assert result["mae_lm"]["class"] == "MaelmModel"


def test_fill_mask_pipeline_agrees_with_jax(exports, reloaded):
    result, _, _ = reloaded
    _, mlm = exports["mlm"]
    tok = mlm.tokenizer
    ids = np.array([_reference_ids(tok, FILL_MASK_TEXT)], np.int32)
    at = int(np.flatnonzero(ids[0] == tok.mask_id)[0])
    logits = export.jax_outputs(mlm, ids, with_lm_head=True)[1][0, at]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    answers = result["mlm"]["fill_mask"]
    assert [a["token"] for a in answers] == list(np.argsort(-probs)[:3])
    np.testing.assert_allclose([a["score"] for a in answers], np.sort(probs)[::-1][:3], rtol=1e-4)


def test_sequence_classification_fine_tune_loss_falls(reloaded):
    result, _, _ = reloaded
    for kind in ("mlm", "mae_lm"):
        losses = result[kind]["fine_tune_losses"]
        first, last = np.mean(losses[:5]), np.mean(losses[-5:])
        assert last < 0.75 * first, (kind, losses)  # chance stays at ln 2 = 0.69


def test_custom_class_is_needed_mpnet_buckets_differ():
    """Why MAE-LM exports ship their own class: HF MPNet's T5 buckets are not ours."""
    import torch
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    offsets = torch.arange(-127, 128)
    mpnet = MPNetEncoder.relative_position_bucket(offsets, num_buckets=32, max_distance=128)
    ours = relative_position_buckets(32, 128, 128)
    assert not np.array_equal(mpnet.numpy(), ours)


def _rewrite_config(step_dir: epath.Path, edit) -> None:
    """Edits the run config stored in a checkpoint and re-signs its manifest."""
    (path,) = [p for p in (step_dir / "config").iterdir() if p.name == "metadata"]
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    record = json.loads((step_dir / manifest.MANIFEST).read_text())
    record["files"]["config/metadata"] = path.stat().length
    record["sha256"]["config/metadata"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (step_dir / manifest.MANIFEST).write_text(json.dumps(record))


@pytest.mark.parametrize(
    "edit,named",
    [
        (lambda c: c["model"].update(segment_isolation=True), "['segment_isolation']"),
        (lambda c: c["model"].update(num_layers=3), "'encoder/layers_2"),
    ],
    ids=["unknown_feature", "params_do_not_fit"],
)
def test_inexact_export_is_refused(tiny_checkpoints, tmp_path, edit, named):
    workdir = tmp_path / "run"
    shutil.copytree(tiny_checkpoints["mae_lm"] / "checkpoints", workdir / "checkpoints")
    (step,) = os.listdir(workdir / "checkpoints")
    _rewrite_config(epath.Path(workdir / "checkpoints" / step), edit)
    with pytest.raises(ConfigError) as e:
        export.export(workdir, tmp_path / "out")
    assert named in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_cli_refuses_in_one_line(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", "maelm_jax.export", f"--workdir={tmp_path}",
         f"--output_dir={tmp_path / 'out'}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("maelm_jax.export: error: output_dir=")
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


# --- Fine-tuning heads: question answering, and no fill-mask without an LM head -------------


def _batch(trained):
    """The parity batch as torch (ids [B, T] int64, attention mask [B, T] bool)."""
    import torch

    ids = export.parity_batch(trained)
    return torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(ids != trained.tokenizer.pad_id)


def _cross_entropy(logits: np.ndarray, positions: np.ndarray) -> float:
    """Mean -log softmax(logits)[position] over the rows whose position lies in the window."""
    keep = positions < logits.shape[1]
    rows = logits[keep] - logits[keep].max(1, keepdims=True)
    log_probs = rows - np.log(np.exp(rows).sum(1, keepdims=True))
    return float(-log_probs[np.arange(keep.sum()), positions[keep]].mean())


def test_question_answering_runs_a_relative_bias_export_on_its_own_encoder(exports):
    """`AutoModelForQuestionAnswering` with remote code, as `run_qa.py` builds it: the same
    encoder numbers as `AutoModel`, a linear start/end head on every position, and the loss
    (CE_start + CE_end) / 2 with positions outside the window ignored."""
    import torch
    from transformers import AutoModel, AutoModelForQuestionAnswering

    result, trained = exports["mae_lm"]
    qa = AutoModelForQuestionAnswering.from_pretrained(result.output_dir, trust_remote_code=True)
    base = AutoModel.from_pretrained(result.output_dir, trust_remote_code=True)
    assert type(qa).__name__ == "MaelmForQuestionAnswering"
    ids, valid = _batch(trained)
    b, t = ids.shape
    starts = torch.tensor([1, 0, t + 3, 2, 5])[:b]  # t + 3: outside the window, ignored
    ends = torch.tensor([[3], [0], [4], [t], [6]])[:b]  # [B, 1], as a data collator may give
    with torch.no_grad():
        hidden = base.eval()(ids, attention_mask=valid).last_hidden_state
        out = qa.eval()(ids, attention_mask=valid, start_positions=starts, end_positions=ends)
        torch.testing.assert_close(
            qa.roberta(ids, attention_mask=valid).last_hidden_state, hidden, rtol=0, atol=0
        )
        w, bias = qa.qa_outputs.weight, qa.qa_outputs.bias
        assert w.shape == (2, hidden.shape[-1])
        assert out.start_logits.shape == out.end_logits.shape == (b, t)
        torch.testing.assert_close(out.start_logits, hidden @ w[0] + bias[0])
        torch.testing.assert_close(out.end_logits, hidden @ w[1] + bias[1])
    start, end = out.start_logits.numpy(), out.end_logits.numpy()
    expected = (_cross_entropy(start, starts.numpy()) + _cross_entropy(end, ends.numpy()[:, 0])) / 2
    assert abs(float(out.loss) - expected) < 1e-5, (float(out.loss), expected)


def test_load_for_question_answering_pretrained_and_random(exports):
    """The loader a fine-tuning loop calls: the export's encoder under a fresh span head
    (`pretrained`), or the same class fresh (`random`); the recipe's dropout on both."""
    from transformers import AutoModel

    from maelm_jax.hf import task_model

    expected = {"mae_lm": "MaelmForQuestionAnswering", "3ml_cross": "RobertaForQuestionAnswering"}
    for kind, name in expected.items():
        path = exports[kind][0].output_dir
        base = AutoModel.from_pretrained(path, trust_remote_code=kind == "mae_lm").state_dict()
        pretrained = task_model.load_for_question_answering(path, "pretrained", 0.2, 0.3)
        random = task_model.load_for_question_answering(path, "random")
        for model in (pretrained, random):
            assert type(model).__name__ == name, kind
        assert pretrained.config.hidden_dropout_prob == 0.2
        assert pretrained.config.attention_probs_dropout_prob == 0.3
        assert random.config.hidden_dropout_prob == 0.1
        encoder = pretrained.roberta.state_dict()
        assert encoder.keys() <= base.keys()
        for key, value in encoder.items():
            assert np.array_equal(value.numpy(), base[key].numpy()), (kind, key)
        word = "embeddings.word_embeddings.weight"
        assert not np.array_equal(random.roberta.state_dict()[word].numpy(), base[word].numpy())


def test_load_for_question_answering_refuses_in_one_line(exports, tmp_path):
    from maelm_jax.hf import task_model

    path = exports["mae_lm"][0].output_dir
    with pytest.raises(ConfigError, match=r"^init='scratch'; allowed: pretrained, random$"):
        task_model.load_for_question_answering(path, "scratch")
    old = tmp_path / "old_export"  # written before the export's code had a QA class
    shutil.copytree(path, old)
    config = json.loads((old / "config.json").read_text())
    del config["auto_map"]["AutoModelForQuestionAnswering"]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"has no AutoModelForQuestionAnswering.*re-export") as e:
        task_model.load_for_question_answering(str(old))
    assert "\n" not in str(e.value)


def test_a_modern_export_answers_questions_with_transformers_own_class(tmp_path):
    """ModernBERT exports use `ModernBertForQuestionAnswering` (transformers >= 4.48), no
    remote code: a directory as modern_convert writes it, with random encoder weights."""
    from tiny_configs import tiny_config
    from transformers import ModernBertConfig, ModernBertModel

    from maelm_jax.config import configdict
    from maelm_jax.hf import modern_convert, task_model

    overrides = {"backbone": "modern", "num_layers": 3, "local_attention": 8}
    cfg = configdict.freeze(tiny_config(**overrides)).model
    saved = modern_convert.hf_config(cfg, 300, with_lm_head=False)
    model = ModernBertModel(ModernBertConfig(**saved))
    model.save_pretrained(tmp_path)
    qa = task_model.load_for_question_answering(str(tmp_path), "pretrained", 0.2, 0.3)
    assert type(qa).__name__ == "ModernBertForQuestionAnswering"
    assert qa.config.classifier_dropout == 0.2 and qa.config.attention_dropout == 0.3
    mine = model.state_dict()
    for key, value in qa.model.state_dict().items():
        assert np.array_equal(value.numpy(), mine[key].numpy()), key


def test_an_encoder_only_export_refuses_masked_lm_instead_of_a_random_head(exports):
    """An MAE-LM export has no LM head (its encoder never predicted tokens): `auto_map` leaves
    `AutoModelForMaskedLM` out, so it and fill-mask stop instead of predicting from a freshly
    initialised head; an MLM export with the bias keeps the entry. The model card says why."""
    from transformers import AutoModelForMaskedLM, pipeline

    from maelm_jax.hf import convert as hf_convert

    result, trained = exports["mae_lm"]
    config = json.loads((epath.Path(result.output_dir) / "config.json").read_text())
    assert "AutoModelForMaskedLM" not in config["auto_map"]
    assert config["auto_map"]["AutoModelForQuestionAnswering"] == (
        "modeling_maelm.MaelmForQuestionAnswering"
    )
    with pytest.raises(ValueError, match=r"MaelmConfig.*AutoModelForMaskedLM"):
        AutoModelForMaskedLM.from_pretrained(result.output_dir, trust_remote_code=True)
    with pytest.raises(ValueError):
        pipeline("fill-mask", model=result.output_dir, trust_remote_code=True)
    card = (epath.Path(result.output_dir) / "README.md").read_text()
    assert "No fill-mask" in card and "leaves `AutoModelForMaskedLM` out" in card
    assert (
        "No fill-mask" not in (epath.Path(exports["mlm"][0].output_dir) / "README.md").read_text()
    )
    mlm_with_bias = hf_convert.hf_config(trained.model_config, 300, with_lm_head=True)
    assert mlm_with_bias["auto_map"]["AutoModelForMaskedLM"] == "modeling_maelm.MaelmForMaskedLM"
