"""Rank measurements on matrices of known rank, and the analysis command on a tiny MLM."""

import json
import pathlib
import shutil

import numpy as np
import pytest

from maelm_jax.config.run_config import ConfigError
from maelm_jax.inspection import rank, representation_rank, trained_model


def _known_spectrum(singular_values, n=400, d=48, seed=0):
    """[n, d] with centred singular values exactly `singular_values` (then zeros), shifted by
    a constant row so centring is needed; and the orthonormal basis [d, r] it spans."""
    rng = np.random.default_rng(seed)
    r = len(singular_values)
    a = rng.normal(size=(n, r))
    q, _ = np.linalg.qr(a - a.mean(axis=0))  # orthonormal columns with zero mean
    basis, _ = np.linalg.qr(rng.normal(size=(d, r)))
    x = (q * np.asarray(singular_values)) @ basis.T
    return x + rng.normal(size=(1, d)) * 5.0, basis


def test_equal_spectrum_of_rank_r():
    x, _ = _known_spectrum([1.0] * 10)
    assert rank.pca_rank(x) == 9  # 9 of 10 equal directions explain exactly 90%
    assert abs(rank.entropy_rank(x) - 10.0) < 1e-6
    assert rank.pca_rank(x, share=0.95) == 10


def test_peaked_spectrum_has_low_effective_rank():
    x, _ = _known_spectrum([10.0] + [1.0] * 9)
    assert rank.pca_rank(x) == 1  # 100 / 109 > 0.9
    assert 1.0 < rank.entropy_rank(x) < 10.0
    flatter, _ = _known_spectrum([3.0] + [1.0] * 9)
    assert rank.entropy_rank(x) < rank.entropy_rank(flatter)


def test_share_inside_a_subspace():
    x, basis = _known_spectrum([1.0] * 6, d=24)
    sub = rank.principal_subspace(x, share=0.999)
    assert sub.shape == (24, 6)
    assert abs(rank.share_inside(x, sub) - 1.0) < 1e-9
    rng = np.random.default_rng(1)
    outside = rng.normal(size=(200, 24))
    outside -= (outside @ basis) @ basis.T  # orthogonal to the subspace
    assert rank.share_inside(outside, sub) < 1e-9


def test_run_writes_json_and_png(tiny_checkpoints, tmp_path):
    workdir = tiny_checkpoints["mlm"]
    out = tmp_path / "rank"
    returned = representation_rank.run(workdir, out, None, num_tokens=300, text_file=None)
    result = json.loads((out / "rank.json").read_text())
    assert result == json.loads(json.dumps(returned))
    assert (out / "rank.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result["layers"] == [0, 1, 2]
    assert set(result["conditions"]) == {"no_mask", "mask15_real", "mask15_mask"}
    for cond in result["conditions"].values():
        assert all(1 <= r <= result["hidden_size"] for r in cond["pca90"])
    shares = result["conditions"]["mask15_mask"]["share_in_real_subspace"]
    assert all(0.0 <= s <= 1.0 for s in shares)

    # The last layer is the encoder's output: recompute its rank from `encode` directly.
    trained = trained_model.load(workdir)
    blocks = representation_rank.held_out_blocks(trained, None, 300)
    positions = np.broadcast_to(np.arange(blocks.shape[1]), blocks.shape)
    hidden = np.asarray(trained.encode_fn()(blocks, positions))
    real = hidden[blocks >= trained.tokenizer.first_regular_id][:300]
    assert result["conditions"]["no_mask"]["pca90"][-1] == rank.pca_rank(real)


def test_scanned_and_unrolled_layers_agree(tiny_checkpoints):
    """Unstacking a scanned checkpoint for per-layer capture keeps the encoder's output."""
    trained = trained_model.load(tiny_checkpoints["3ml_cross"])
    assert trained.model_config.scan_layers
    model, params = representation_rank.unrolled(trained)
    ids = representation_rank.held_out_blocks(trained, None, 60)[:2]
    layers = np.asarray(representation_rank.layer_outputs_fn(model, 2)(params, ids))
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    final = np.asarray(trained.encode_fn()(ids, positions))
    np.testing.assert_allclose(layers[-1], final, atol=1e-5)
    assert np.abs(layers[1] - layers[0]).max() > 1e-3  # distinct layers, not one repeated


def test_a_moved_corpus_is_read_where_it_is_now(tiny_checkpoints, tmp_path):
    """A study folder moved with its checkpoints: the checkpoint names the corpus at its old
    path, and the rank reads the same eval split from the new one (`--dataset`)."""
    trained = trained_model.load(tiny_checkpoints["mlm"])
    stored = trained.config.data.dataset
    old_dir = pathlib.Path(stored.removeprefix("text:")).parent
    moved = tmp_path / "moved"
    shutil.copytree(old_dir, moved)
    with pytest.raises(ConfigError):  # nowhere: the stored path's text is what is read
        representation_rank.held_out_blocks(trained, None, 300, f"text:{tmp_path}/gone/*.txt")
    here = representation_rank.held_out_blocks(trained, None, 300, f"text:{moved}/*.txt")
    np.testing.assert_array_equal(here, representation_rank.held_out_blocks(trained, None, 300))
    result = representation_rank.run(
        tiny_checkpoints["mlm"], tmp_path / "rank", None, 300, None, f"text:{moved}/*.txt"
    )
    assert result["text"] == f"text:{moved}/*.txt (eval split)"
