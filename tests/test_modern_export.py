"""Modern-backbone runs export as transformers' own ModernBERT classes: parity above the local
window, a fresh offline process that loads them without `trust_remote_code`, and fill-mask."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from text_corpora import sample_document, write_corpus
from tiny_configs import REPO_ROOT, tiny_run_config

from maelm_jax.config import configdict
from maelm_jax.hf import export
from maelm_jax.inspection import trained_model
from maelm_jax.training import train

EXPECTED_CLASS = {"mlm": "ModernBertForMaskedLM", "mae_lm": "ModernBertModel"}
WINDOW = 8  # tokens a local layer sees: 4 either side; the parity rows are longer


@pytest.fixture(scope="module")
def modern_exports(tmp_path_factory):
    """{kind: (ExportResult, TrainedModel)} of tiny modern MLM and MAE-LM runs (3 steps)."""
    root = tmp_path_factory.mktemp("modern")
    dataset = write_corpus(root / "corpus", [sample_document(i) for i in range(240)])
    out = {}
    for kind in EXPECTED_CLASS:
        config = tiny_run_config(
            dataset,
            objective=kind,
            num_train_steps=3,
            warmup_steps=1,
            checkpoint_every_steps=3,
            eval_batches=0,
            **{
                "model.backbone": "modern",
                "model.num_layers": 3,  # global, local, local
                "model.local_attention": WINDOW,
                "model.dropout_rate": 0.0,
                "model.attention_dropout_rate": 0.0,
            },
        )
        workdir = root / kind
        train.train_and_evaluate(configdict.freeze(config), workdir)
        out[kind] = (export.export(workdir, root / f"{kind}_hf"), trained_model.load(workdir))
    return out


def test_modern_runs_export_to_modernbert_with_parity_above_the_window(modern_exports):
    for kind, (result, trained) in modern_exports.items():
        assert result.hf_class == EXPECTED_CLASS[kind]
        assert result.max_abs_diff_hidden <= export.TOLERANCE
        ids = export.parity_batch(trained)
        assert (ids != trained.tokenizer.pad_id).sum(1).max() > WINDOW + 8  # windows bite
        with open(os.path.join(result.output_dir, "config.json")) as f:
            config = json.load(f)
        assert config["model_type"] == "modernbert" and "auto_map" not in config
        assert config["layer_types"] == ["full_attention", "sliding_attention"] * 1 + [
            "sliding_attention"
        ]
        assert config["local_attention"] == WINDOW and config["norm_bias"] is False
        assert not any(f.endswith(".py") for f in os.listdir(result.output_dir))
    assert modern_exports["mlm"][0].max_abs_diff_logits <= export.TOLERANCE


def test_a_fresh_process_loads_them_without_remote_code(modern_exports, tmp_path):
    _, mlm = modern_exports["mlm"]
    ids = export.parity_batch(mlm)
    spec = {
        "exports": {
            kind: {"dir": result.output_dir, "remote_code": False, "mlm": kind == "mlm"}
            for kind, (result, _) in modern_exports.items()
        },
        "ids": ids.tolist(),
        "texts": ["The quiet river stood near the old garden."],
        "fill_mask_text": "The old <mask> stood.",
        "fine_tune": [],
        "sentence_transformers": ["mae_lm"],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "hf_reload.py"), str(tmp_path / "spec.json"),
         str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    valid = ids != mlm.tokenizer.pad_id
    for kind, (_, trained) in modern_exports.items():
        assert result[kind]["class"] == EXPECTED_CLASS[kind]
        jax_hidden = export.jax_outputs(trained, ids, with_lm_head=False)[0]
        torch_hidden = np.load(tmp_path / f"{kind}_hidden.npy")
        assert np.abs(jax_hidden - torch_hidden)[valid].max() <= export.TOLERANCE, kind
    jax_logits = export.jax_outputs(mlm, ids, with_lm_head=True)[1]
    torch_logits = np.load(tmp_path / "mlm_logits.npy")
    assert np.abs(jax_logits - torch_logits)[valid].max() <= export.TOLERANCE
    # sentence-transformers loads the encoder export and mean-pools the JAX encoder's output
    ids = np.asarray([result["mae_lm"]["sentence_ids"]], np.int32)
    hidden = export.jax_outputs(modern_exports["mae_lm"][1], ids, with_lm_head=False)[0]
    np.testing.assert_allclose(
        result["mae_lm"]["sentence_embedding"], hidden[0].mean(0), atol=export.TOLERANCE
    )
    fill = result["mlm"]["fill_mask"]
    assert len(fill) == 3 and all("<mask>" not in f["sequence"] for f in fill)
    assert fill[0]["score"] >= fill[-1]["score"] > 0
