"""The modern backbone (`model.backbone="modern"`): rotary positions and the local window at
original positions, so a gathered encoder computes what the full sequence computes; every
objective trains on it; and the roberta backbone is unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_model import (
    SEQ,
    assert_splash_matches_xla,
    assert_trees_close,
    build,
    grad_fn,
    make_batch,
    stack_layers,
)
from tiny_configs import frozen, tiny_config

from maelm_jax.data.tokenizer import PAD_ID
from maelm_jax.model import masking
from maelm_jax.model.attention import attend
from maelm_jax.model.encoder import gather_positions
from maelm_jax.model.masked_lm import MaskedLM
from maelm_jax.model.positions.rotary import Window, rotate, rotations

MODERN = dict(
    backbone="modern",
    num_layers=3,
    local_attention=8,  # a local query sees 4 positions either side of 32
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)


def random_positions(rng, batch, n, length):
    """[batch, n] ascending distinct positions in [0, length): a kept subsequence."""
    return np.sort(np.stack([rng.choice(length, n, replace=False) for _ in range(batch)]), 1)


def test_rotating_gathered_tokens_at_their_positions_is_rotating_the_full_sequence():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, SEQ, 4, 8)), jnp.float32)
    idx = jnp.asarray(random_positions(rng, 2, 11, SEQ))
    full = rotations(jnp.arange(SEQ)[None], 8, 160_000.0, 10_000.0)
    kept = rotations(idx, 8, 160_000.0, 10_000.0)
    for is_global in (True, False):
        whole = rotate(x, *full.for_layer(is_global))
        gathered = rotate(gather_positions(x, idx), *kept.for_layer(is_global))
        np.testing.assert_allclose(gathered, gather_positions(whole, idx), atol=1e-6)


def test_rotated_scores_depend_only_on_the_distance():
    rng = np.random.default_rng(1)
    q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32) for _ in range(2))

    def score(p_q, p_k):
        rq = rotations(jnp.asarray([[p_q]]), 8, 160_000.0, 10_000.0)
        rk = rotations(jnp.asarray([[p_k]]), 8, 160_000.0, 10_000.0)
        return float(jnp.sum(rotate(q, *rq.for_layer(False)) * rotate(k, *rk.for_layer(False))))

    assert score(3, 10) == pytest.approx(score(103, 110), abs=1e-4)
    assert score(3, 10) != pytest.approx(score(3, 11), abs=1e-3)


def dense_reference(q, k, v, q_pos, k_pos, q_seg, k_seg, half):
    """numpy attention with the window and segment mask written out."""
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    window = np.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= half
    allowed = (window & (q_seg[:, :, None] == k_seg[:, None, :]))[:, None]
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = probs / probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", probs, v)


@pytest.mark.parametrize("query_chunk,block", [(0, 128), (8, 128), (0, 4)])
def test_the_local_window_in_position_space_matches_a_dense_reference(query_chunk, block):
    """Dense with the window as a mask (in query chunks or not), and blocked: 4 queries
    against the 10 keys their window can reach."""
    rng = np.random.default_rng(2)
    b, t, n, h, half = 2, 20, 2, 8, 3
    q, k, v = (rng.normal(size=(b, t, n, h)).astype(np.float32) for _ in range(3))
    positions = random_positions(rng, b, t, 48)  # kept tokens with gaps between them
    segments = np.where(np.arange(t) < 13, 1, 2)[None].repeat(b, 0).astype(np.int32)
    window = Window(jnp.asarray(positions), jnp.asarray(positions), False, half, block)
    out = attend(
        *map(jnp.asarray, (q, k, v, segments, segments)),
        None,
        query_chunk=query_chunk,
        window=window,
    )
    expected = dense_reference(q, k, v, positions, positions, segments, segments, half)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    # being global as data (a scanned stack): the same through the cond
    traced = jax.jit(
        lambda g: attend(
            *map(jnp.asarray, (q, k, v, segments, segments)),
            None,
            query_chunk=query_chunk,
            window=window.replace(is_global=g),
        )
    )
    np.testing.assert_allclose(traced(False), expected, atol=1e-5)
    # a global layer lifts the window
    lifted = attend(
        *map(jnp.asarray, (q, k, v, segments, segments)),
        None,
        window=window.replace(is_global=jnp.bool_(True)),
    )
    expected = dense_reference(q, k, v, positions, positions, segments, segments, 10**6)
    np.testing.assert_allclose(lifted, expected, atol=1e-5)


@pytest.mark.parametrize("scan_layers,block", [(True, 128), (True, 4), (False, 4)])
def test_the_gathered_encoder_computes_what_the_full_sequence_computes(scan_layers, block):
    """Encoding only the kept tokens at their original positions equals encoding the whole
    row with the masked tokens hidden from them (their own segment): rotations and local
    windows (layers 1 and 2 here) are the full sequence's. With blocks of 4 the local
    layers run blocked (4 queries against 12 keys of 24 kept, 32 in the row)."""
    chunked = dict(MODERN, local_attention_block=block)
    model, params, batch = build("mae_lm", "self", scan_layers=scan_layers, **chunked)
    visible = batch.visible_idx
    encode = lambda *a: model.apply({"params": params}, *a, method=MaskedLM.encode)
    gathered = encode(
        gather_positions(batch.input_ids, visible),
        visible,
        True,
        gather_positions(batch.segment_ids, visible),
    )
    hidden = jnp.zeros(batch.input_ids.shape, bool)
    hidden = jax.vmap(lambda h, m: h.at[m].set(True))(hidden, batch.masked_idx)
    segments = jnp.where(hidden, batch.segment_ids + 1000, batch.segment_ids)
    full = encode(batch.input_ids, jnp.arange(SEQ)[None], True, segments)
    np.testing.assert_allclose(gathered, gather_positions(full, visible), atol=2e-5)
    # and the windows did something: all-global layers give another output
    model_global, _, _ = build(
        "mae_lm",
        "self",
        scan_layers=scan_layers,
        **{**chunked, "global_attention_every_n_layers": 1},
    )
    all_global = model_global.apply(
        {"params": params},
        gather_positions(batch.input_ids, visible),
        visible,
        True,
        gather_positions(batch.segment_ids, visible),
        method=MaskedLM.encode,
    )
    assert np.max(np.abs(all_global - gathered)) > 1e-3


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_scanned_layers_give_the_unrolled_loss_and_gradients(decoder):
    """Scanned, a layer's kind (global or local, normed or not) is data; unrolled it is
    static: the two must agree."""
    model_loop, params_loop, batch = build("mae_lm", decoder, scan_layers=False, **MODERN)
    model_scan = MaskedLM(frozen(tiny_config("mae_lm", decoder, SEQ, **MODERN))[0], pad_id=PAD_ID)
    rng = jax.random.PRNGKey(1)
    (loss_loop, _), grads_loop = jax.jit(grad_fn(model_loop, True))(params_loop, batch, rng)
    params_scan = stack_layers(params_loop)
    (loss_scan, _), grads_scan = jax.jit(grad_fn(model_scan, True))(params_scan, batch, rng)
    np.testing.assert_allclose(loss_scan, loss_loop, rtol=1e-6)
    assert_trees_close(grads_scan, stack_layers(grads_loop), atol=1e-6, rtol=1e-4)
    # ModernBERT's first layer has no attention norm: its scale gets no gradient
    first = grads_loop["encoder"]["layers_0"]["attention_norm"]["scale"]
    assert not np.any(first) and np.any(
        grads_loop["encoder"]["layers_1"]["attention_norm"]["scale"]
    )


@pytest.mark.parametrize(
    "objective,decoder", [("mlm", "self"), ("mae_lm", "self"), ("mae_lm", "cross")]
)
def test_each_objective_trains_on_the_modern_backbone_without_recompiling(objective, decoder):
    cfg = tiny_config(objective, decoder, SEQ, **MODERN)
    model_cfg, mask_cfg = frozen(cfg)
    model = MaskedLM(model_cfg, pad_id=PAD_ID)
    _, params, _ = build(objective, decoder, **MODERN)
    tx = optax.adam(3e-3)

    @jax.jit
    def step(params, opt_state, rng):
        mask_rng, dropout_rng = jax.random.split(rng)
        masked = masking.mask_batch(mask_rng, batch_ids, mask_cfg)
        (loss, _), grads = grad_fn(model)(params, masked, dropout_rng)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    batch_ids = make_batch(0)
    opt_state, losses = tx.init(params), []
    for i in range(12):
        params, opt_state, loss = step(params, opt_state, jax.random.PRNGKey(i % 2))
        losses.append(float(loss))
    assert step._cache_size() == 1
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.5, losses


# The roberta backbone's loss and gradient norm on a fixed seed, with dropout and the
# relative bias on, computed by commit c096600 (before the modern backbone existed).
ROBERTA_BEFORE = {
    ("mlm", "self"): (5.941104888916016, 1.7841079059256992),
    ("mae_lm", "self"): (5.941989421844482, 1.8877271203615147),
    ("mae_lm", "cross"): (5.942047595977783, 1.8849931540503528),
}


@pytest.mark.parametrize("objective,decoder", list(ROBERTA_BEFORE))
def test_the_roberta_backbone_is_unchanged(objective, decoder):
    model, params, batch = build(
        objective, decoder, relative_attention_buckets=8, decoder_relative_attention=True
    )
    (loss, _), grads = jax.jit(grad_fn(model))(params, batch, jax.random.PRNGKey(7))
    norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree_util.tree_leaves(grads)))
    expected_loss, expected_norm = ROBERTA_BEFORE[(objective, decoder)]
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-6)
    np.testing.assert_allclose(norm, expected_norm, rtol=1e-5)


def test_splash_serves_the_global_layers_with_the_xla_models_loss_and_gradients():
    """attention_impl="splash" (interpreted on CPU) on the modern backbone: the global layers
    and the decoder take the kernel, the scanned encoder through the cond, the local layers
    stay on XLA; loss and gradients are the all-XLA model's."""
    assert_splash_matches_xla("self", **MODERN)


def test_remat_gives_the_same_gradients_on_the_modern_backbone():
    """The large configs' policies (dots_saveable encoder, full decoder) with the layer index
    a scanned input (and a static argument of an unrolled remat block)."""
    for scan in (True, False):
        model, params, batch = build("mae_lm", "self", **MODERN, scan_layers=scan)
        rng = jax.random.PRNGKey(3)
        (want, _), grads_want = jax.jit(grad_fn(model, True))(params, batch, rng)
        policies = dict(remat_policy="dots_saveable", decoder_remat_policy="full")
        config = tiny_config("mae_lm", "self", SEQ, **MODERN, scan_layers=scan, **policies)
        remat = MaskedLM(frozen(config)[0], pad_id=PAD_ID)
        (got, _), grads = jax.jit(grad_fn(remat, True))(params, batch, rng)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert_trees_close(grads, grads_want, atol=1e-6, rtol=1e-4)


def test_the_rank_analysis_captures_every_modern_layer():
    """`maelm_jax.analysis` reads each block's output: the modern blocks are captured too
    (the embedding norm, then one [B, T, E] per layer, each different)."""
    from maelm_jax.inspection.representation_rank import layer_outputs_fn

    model, params, batch = build("mae_lm", "self", **MODERN, scan_layers=False)
    outs = np.asarray(layer_outputs_fn(model, 3)(params, batch.input_ids))
    assert outs.shape == (4, *batch.input_ids.shape, 32)
    assert all(np.abs(outs[i + 1] - outs[i]).max() > 1e-3 for i in range(3))
