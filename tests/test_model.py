"""The models' semantics: what the encoder sees, what the decoders get, shapes and sizes."""

import collections
import contextlib
import dataclasses
import io

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_configs import frozen, tiny_config

from configs import (
    mae_lm_base,
    mae_lm_large,
    mlm_base,
    mlm_large,
    three_ml_cross_base,
    three_ml_cross_large,
    three_ml_self_base,
    three_ml_self_large,
)
from maelm_jax.config import configdict
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, MASK_ID, PAD_ID
from maelm_jax.model import loss, masking
from maelm_jax.model.masked_lm import MaskedLM, count_params, init_inputs
from maelm_jax.model.positions.segments import segment_ids

SEQ = 32


def make_batch(seed=0, batch=4, lengths=None):
    rng = np.random.default_rng(seed)
    lengths = lengths or [SEQ - 2] * batch
    ids = np.full((batch, SEQ), PAD_ID, np.int32)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, 1 + n] = BOS_ID, EOS_ID
        ids[row, 1 : 1 + n] = rng.integers(FIRST_REGULAR_ID, 300, n)
    return jnp.asarray(ids)


def build(objective="mae_lm", decoder="self", seed=0, lengths=None, **model_overrides):
    model_cfg, mask_cfg = frozen(tiny_config(objective, decoder, SEQ, **model_overrides))
    model = MaskedLM(model_cfg, pad_id=PAD_ID)
    mask = jax.jit(masking.mask_batch, static_argnums=2)
    batch = mask(jax.random.PRNGKey(seed), make_batch(seed, lengths=lengths), mask_cfg)
    init = jax.jit(lambda rng, b: model.init(rng, b.input_ids, b.masked_idx, b.visible_idx))
    params = nn.unbox(init(jax.random.PRNGKey(42), batch)["params"])
    return model, params, batch


_APPLY = {}


def run(model, params, batch, input_ids=None):
    """-> (logits, intermediates) in deterministic mode; one compile per model."""
    if id(model) not in _APPLY:
        apply = lambda *a, **kw: model.apply(*a, **kw, mutable=["intermediates"])
        _APPLY[id(model)] = (model, jax.jit(apply))
    ids = batch.input_ids if input_ids is None else input_ids
    apply = _APPLY[id(model)][1]
    logits, state = apply(
        {"params": params},
        ids,
        batch.masked_idx,
        batch.visible_idx,
        segment_ids=batch.segment_ids,
    )
    return logits, state.get("intermediates", {})


def mask_vector(model, params):
    """The [MASK] vector the decoder uses, from wherever `mask_token_source` keeps it."""
    if model.config.mask_token_source == "embedding_row":
        return np.asarray(params["token_embed"]["embedding"][MASK_ID])
    return np.asarray(params["decoder"]["mask_embedding"])


def with_mask_vector(model, params, vector):
    changed = jax.tree_util.tree_map(lambda x: x, params)
    if model.config.mask_token_source == "embedding_row":
        table = changed["token_embed"]["embedding"]
        changed["token_embed"]["embedding"] = table.at[MASK_ID].set(vector)
    else:
        changed["decoder"]["mask_embedding"] = jnp.asarray(vector)
    return changed


@pytest.mark.parametrize(
    "decoder,source", [("self", "embedding_row"), ("cross", "embedding_row"), ("cross", "learned")]
)
def test_encoder_never_sees_masked_tokens_or_mask_embedding(decoder, source):
    model, params, batch = build(
        "mae_lm", decoder, relative_attention_buckets=8, mask_token_source=source
    )
    logits, inter = run(model, params, batch)
    encoded = inter["encoder_output"][0]

    scrambled = np.array(batch.input_ids)
    rows = np.arange(scrambled.shape[0])[:, None]
    scrambled[rows, np.asarray(batch.masked_idx)] = FIRST_REGULAR_ID + 7
    logits2, inter2 = run(model, params, batch, jnp.asarray(scrambled))
    np.testing.assert_array_equal(inter2["encoder_output"][0], encoded)
    np.testing.assert_array_equal(logits2, logits)

    changed = with_mask_vector(model, params, mask_vector(model, params) + 1.0)
    logits3, inter3 = run(model, changed, batch)
    np.testing.assert_array_equal(inter3["encoder_output"][0], encoded)
    assert not np.allclose(logits3, logits), "the [MASK] embedding must reach the decoder"


def test_mlm_encoder_does_see_masked_slots():
    """Control for the test above: the same edit does change an MLM encoder's output."""
    model, params, batch = build("mlm")
    logits, _ = run(model, params, batch)
    scrambled = np.array(batch.input_ids)
    rows = np.arange(scrambled.shape[0])[:, None]
    scrambled[rows, np.asarray(batch.masked_idx)] = FIRST_REGULAR_ID + 7
    logits2, _ = run(model, params, batch, jnp.asarray(scrambled))
    assert not np.allclose(logits2, logits)


@pytest.mark.parametrize("buckets", [0, 8])
def test_encoder_output_is_the_visible_subsequence_at_original_positions(buckets):
    lengths = [SEQ - 2, 20, 12, SEQ - 2]
    model, params, batch = build("mae_lm", relative_attention_buckets=buckets, lengths=lengths)
    _, inter = run(model, params, batch)
    encoded = np.asarray(inter["encoder_output"][0])
    for row in range(len(lengths)):
        positions = batch.visible_idx[row : row + 1]
        ids = jnp.take_along_axis(batch.input_ids[row : row + 1], positions, axis=1)
        alone = model.apply({"params": params}, ids, positions, method=MaskedLM.encode)
        valid = np.asarray(ids[0] != PAD_ID)
        np.testing.assert_allclose(encoded[row][valid], alone[0][valid], atol=1e-5, rtol=1e-5)
        contiguous = jnp.arange(positions.shape[1])[None]
        wrong = model.apply({"params": params}, ids, contiguous, method=MaskedLM.encode)
        assert not np.allclose(encoded[row][valid], wrong[0][valid], atol=1e-3)


def test_self_decoder_input_matches_numpy_reference():
    model, params, batch = build("mae_lm", "self", lengths=[SEQ - 2, 10, 25, SEQ - 2])
    _, inter = run(model, params, batch)
    encoded = np.asarray(inter["encoder_output"][0])
    got = np.asarray(inter["decoder"]["decoder_input"][0])
    positions = np.asarray(params["decoder"]["position_embed"]["embedding"])
    mask_vec = mask_vector(model, params)
    want = np.zeros((batch.input_ids.shape[0], SEQ, mask_vec.shape[0]), np.float32)
    for b in range(want.shape[0]):
        for j, pos in enumerate(np.asarray(batch.visible_idx[b])):
            want[b, pos] = encoded[b, j] + positions[pos]
        for pos in np.asarray(batch.masked_idx[b]):
            want[b, pos] = mask_vec + positions[pos]
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("source", ["embedding_row", "learned"])
def test_cross_decoder_queries_are_mask_embedding_at_masked_positions(source):
    model, params, batch = build("mae_lm", "cross", mask_token_source=source)
    assert ("mask_embedding" in params["decoder"]) == (source == "learned")
    _, inter = run(model, params, batch)
    got = np.asarray(inter["decoder"]["decoder_input"][0])
    positions = np.asarray(params["decoder"]["position_embed"]["embedding"])
    mask_vec = mask_vector(model, params)
    want = mask_vec + positions[np.asarray(batch.masked_idx)]
    assert got.shape == (batch.masked_idx.shape[0], batch.masked_idx.shape[1], mask_vec.shape[0])
    np.testing.assert_allclose(got, want, atol=1e-6)


def loss_fn_of(model, deterministic=False):
    """(params, batch, rng) -> (mean loss, logits' shape)."""

    def loss_fn(params, batch, rng):
        logits = model.apply(
            {"params": params},
            batch.input_ids,
            batch.masked_idx,
            batch.visible_idx,
            deterministic=deterministic,
            segment_ids=batch.segment_ids,
            rngs={"dropout": rng},
        )
        sums = loss.masked_lm_sums(logits, batch.labels, batch.mask_weights)
        return loss.mean_loss(sums), logits.shape

    return loss_fn


def grad_fn(model, deterministic=False):
    return jax.value_and_grad(loss_fn_of(model, deterministic), has_aux=True)


@pytest.mark.parametrize(
    "objective,decoder", [("mlm", "self"), ("mae_lm", "self"), ("mae_lm", "cross")]
)
def test_compiles_once_for_any_mask_and_padding(objective, decoder):
    model_cfg, mask_cfg = frozen(tiny_config(objective, decoder, SEQ))
    model = MaskedLM(model_cfg, pad_id=PAD_ID)

    @jax.jit
    def step(params, ids, rng):
        mask_rng, dropout_rng = jax.random.split(rng)
        return grad_fn(model)(params, masking.mask_batch(mask_rng, ids, mask_cfg), dropout_rng)

    _, params, _ = build(objective, decoder)
    for seed, lengths in enumerate([None, [3, 30, 0, 12], [SEQ - 2, 1, 1, 1]]):
        (_, shape), _ = step(params, make_batch(seed, lengths=lengths), jax.random.PRNGKey(seed))
    assert step._cache_size() == 1
    k = mask_cfg.num_masked
    assert tuple(shape) == (4, k, model_cfg.vocab_size)  # logits for the k slots only


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_gradients_reach_mask_embedding_decoder_and_encoder(decoder):
    model, params, batch = build(
        "mae_lm",
        decoder,
        mask_token_source="learned",
        relative_attention_buckets=8,
        decoder_relative_attention=True,
    )
    assert set(params["decoder"]["relative_bias"]) == {"embedding"}
    _, grads = jax.jit(grad_fn(model))(params, batch, jax.random.PRNGKey(0))
    # Every parameter tensor, [MASK] embedding and decoder and encoder included, gets signal.
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert float(jnp.abs(g).max()) > 0, jax.tree_util.keystr(path)
    assert float(jnp.abs(grads["decoder"]["mask_embedding"]).min()) > 0


@pytest.mark.parametrize("decoder", ["self"])  # "cross" takes its vector the same way
def test_embedding_row_mask_gets_the_decoders_gradient(decoder):
    """With mask_token_source="embedding_row" the <mask> row gets, on top of its tied LM-head
    gradient, exactly what a learned [MASK] vector with the same value would get."""
    row_model, params, batch = build("mae_lm", decoder, mask_token_source="embedding_row")
    assert "mask_embedding" not in params["decoder"]
    learned_cfg = frozen(tiny_config("mae_lm", decoder, SEQ, mask_token_source="learned"))[0]
    learned_model = MaskedLM(learned_cfg, pad_id=PAD_ID)
    learned_params = jax.tree_util.tree_map(lambda x: x, params)
    learned_params["decoder"]["mask_embedding"] = params["token_embed"]["embedding"][MASK_ID]
    rng = jax.random.PRNGKey(0)
    (loss_row, _), g_row = jax.jit(grad_fn(row_model))(params, batch, rng)
    (loss_learned, _), g_learned = jax.jit(grad_fn(learned_model))(learned_params, batch, rng)
    np.testing.assert_allclose(loss_row, loss_learned, rtol=1e-6)
    through_decoder = g_row["token_embed"]["embedding"][MASK_ID]
    through_decoder -= g_learned["token_embed"]["embedding"][MASK_ID]
    assert float(jnp.abs(through_decoder).max()) > 1e-4
    np.testing.assert_allclose(
        through_decoder, g_learned["decoder"]["mask_embedding"], atol=1e-6, rtol=1e-4
    )


def stack_layers(tree):
    """Unscanned params (layers_0, layers_1, ...) -> the scanned layout (stacked 'layers')."""
    if not isinstance(tree, dict):
        return tree
    out, stacked = {}, {}
    for key, value in tree.items():
        if key.startswith("layers_"):
            stacked[int(key.split("_")[1])] = stack_layers(value)
        else:
            out[key] = stack_layers(value)
    if stacked:
        layers = [stacked[i] for i in sorted(stacked)]
        out["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
    return out


def assert_trees_close(a, b, **tolerances):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, **tolerances), a, b)


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_scan_over_layers_gives_the_same_loss_and_gradients(decoder):
    model_loop, params_loop, batch = build("mae_lm", decoder, scan_layers=False)
    model_scan = MaskedLM(frozen(tiny_config("mae_lm", decoder, SEQ))[0], pad_id=PAD_ID)
    rng = jax.random.PRNGKey(1)
    loop_fn = jax.jit(grad_fn(model_loop, deterministic=True))
    (loss_loop, _), grads_loop = loop_fn(params_loop, batch, rng)
    params_scan = stack_layers(params_loop)
    scan_fn = jax.jit(grad_fn(model_scan, deterministic=True))
    (loss_scan, _), grads_scan = scan_fn(params_scan, batch, rng)
    np.testing.assert_allclose(loss_scan, loss_loop, rtol=1e-6)
    assert_trees_close(grads_scan, stack_layers(grads_loop), atol=1e-6, rtol=1e-4)


# (encoder policy, decoder policy) pairs: every encoder policy once (the encoder is the same
# under either decoder) and the full decoder policy under each decoder.
REMAT_PAIRS = {
    "self": (("full", "none"), ("dots_saveable", "full")),
    "cross": (("dots_but_query", "full"),),
}


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_remat_gives_the_same_gradients(decoder):
    """Each stack's policy (the large configs': dots_saveable encoder, full decoder) replays
    the same dropout masks and gives the plain step's gradients."""
    drop = dict(decoder_dropout_rate=0.1, decoder_attention_dropout_rate=0.1)
    model, params, batch = build("mae_lm", decoder, **drop)
    rng = jax.random.PRNGKey(3)  # dropout on: remat must replay the same dropout masks
    (loss_plain, _), grads_plain = jax.jit(grad_fn(model))(params, batch, rng)
    for policy, decoder_policy in REMAT_PAIRS[decoder]:
        policies = dict(drop, remat_policy=policy, decoder_remat_policy=decoder_policy)
        cfg = frozen(tiny_config("mae_lm", decoder, SEQ, **policies))[0]
        remat_model = MaskedLM(cfg, pad_id=PAD_ID)
        (loss_remat, _), grads = jax.jit(grad_fn(remat_model))(params, batch, rng)
        np.testing.assert_allclose(loss_remat, loss_plain, rtol=1e-6)
        assert_trees_close(grads, grads_plain, atol=1e-6, rtol=1e-4)

    def remat_stacks(decoder_policy):  # rematerialised layer stacks in the step's program
        cfg = frozen(
            tiny_config(
                "mae_lm",
                decoder,
                SEQ,
                remat_policy="dots_saveable",
                decoder_remat_policy=decoder_policy,
            )
        )[0]
        step = grad_fn(MaskedLM(cfg, pad_id=PAD_ID))
        return str(jax.make_jaxpr(step)(params, batch, rng)).count("remat")

    assert remat_stacks("full") == remat_stacks("none") + 1  # the decoder's policy is used


def _saved_layer_stacks(policy: str, params, batch) -> collections.Counter:
    """Shapes of the per-layer values the encoder's scan keeps for the backward pass."""
    cfg = frozen(tiny_config("mae_lm", "self", SEQ, remat_policy=policy))[0]
    loss_fn = loss_fn_of(MaskedLM(cfg, pad_id=PAD_ID))
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        jax.ad_checkpoint.print_saved_residuals(
            lambda p: loss_fn(p, batch, jax.random.PRNGKey(3))[0], params
        )
    shapes = [
        line.split()[0] for line in listing.getvalue().splitlines() if "output of scan" in line
    ]
    return collections.Counter(s for s in shapes if s.startswith(f"f32[{cfg.num_layers},"))


def test_stacks_save_token_major_values_and_dots_but_query_one_less():
    """With T not a multiple of 128 the encoder's scan keeps its per-layer values token-major,
    [layers, B * T, F] (so a TPU pads B * T, not T: remat.py), but the MLP's hidden layer;
    dots_but_query keeps dots_saveable's but one [B * T, E] (the query projection, by name),
    which the backward recomputes."""
    model, params, batch = build("mae_lm", "self")
    cfg = model.config
    rows, kept = batch.visible_idx.shape
    tokens = f"f32[{cfg.num_layers},{rows * kept},"
    all_dots = _saved_layer_stacks("dots_saveable", params, batch)
    but_query = _saved_layer_stacks("dots_but_query", params, batch)
    hidden = f"{tokens}{cfg.hidden_size}]"  # also the [N * H] projections: N * H = E here
    # Query, key, value, attention output, MLP output, and each block's input.
    assert all_dots[hidden] == 6
    mlp = f"f32[{cfg.num_layers},{rows},{kept},{cfg.mlp_dim}]"  # stays [B, T, M] (remat.py)
    assert all_dots[mlp] == 1
    assert sum(all_dots.values()) == 7
    assert all_dots - but_query == collections.Counter({hidden: 1})
    assert not but_query - all_dots


@pytest.mark.parametrize(
    "objective,decoder", [("mlm", "self"), ("mae_lm", "self"), ("mae_lm", "cross")]
)
def test_query_blocks_give_the_same_loss_and_gradients(objective, decoder):
    """attention_query_chunk in every attention (encoder, both decoders, with the encoder's and
    the decoder's relative bias), under the large configs' remat policy: same loss, same
    gradients, the relative bias tables included."""
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=objective == "mae_lm")
    model, params, batch = build(objective, decoder, **bias)
    rng = jax.random.PRNGKey(3)
    (loss_whole, _), grads_whole = jax.jit(grad_fn(model, deterministic=True))(params, batch, rng)
    overrides = dict(bias, attention_query_chunk=5, remat_policy="dots_saveable")
    blocked = MaskedLM(frozen(tiny_config(objective, decoder, SEQ, **overrides))[0], PAD_ID)
    (loss, _), grads = jax.jit(grad_fn(blocked, deterministic=True))(params, batch, rng)
    np.testing.assert_allclose(loss, loss_whole, rtol=1e-6)
    assert_trees_close(grads, grads_whole, atol=1e-6, rtol=1e-4)
    assert np.abs(grads["encoder"]["relative_bias"]["embedding"]).max() > 0


@pytest.mark.parametrize("objective,decoder", [("mlm", "self"), ("mae_lm", "cross")])
def test_lm_head_in_blocks_gives_the_same_sums_and_gradients(objective, decoder):
    """lm_head_chunk: the k = 8 slots in blocks of 3 (the last padded with weight-0 slots)
    give the training loss's sums and gradients of the whole [B, k, V] logits, and the
    blocked program never holds them."""
    from maelm_jax.step.train_step import loss_sums

    model, params, batch = build(objective, decoder)
    blocked = MaskedLM(frozen(tiny_config(objective, decoder, SEQ, lm_head_chunk=3))[0], PAD_ID)
    rng = jax.random.PRNGKey(3)
    grads = {
        m: jax.jit(jax.grad(lambda p, m=m: loss_sums(p, batch, rng, m), has_aux=True))(params)
        for m in (model, blocked)
    }
    (g_whole, sums_whole), (g_blocked, sums_blocked) = grads[model], grads[blocked]
    assert batch.masked_idx.shape[1] == 8
    assert_trees_close(sums_blocked, sums_whole, rtol=1e-6)
    assert_trees_close(g_blocked, g_whole, atol=1e-6, rtol=1e-4)
    logits = f"f32[{batch.input_ids.shape[0]},8,{model.config.vocab_size}]"
    jaxpr = {
        m: str(jax.make_jaxpr(lambda p, m=m: loss_sums(p, batch, rng, m))(params))
        for m in (model, blocked)
    }
    assert logits in jaxpr[model] and logits not in jaxpr[blocked]


def expected_params(cfg, vocab=32768):
    """The standard count for post-LN transformers with biases, tied output embedding.

    encoder layer = 4E^2 + 4E (q, k, v, out) + 2EM + M + E (MLP) + 4E (two LayerNorms)
    cross layer   = two attentions 8E^2 + 8E, the MLP, three LayerNorms 6E
    embeddings    = VE (tokens) + PE (positions) + 2E (LayerNorm)
    LM head       = E^2 + E (dense) + 2E (LayerNorm) + V (output bias)
    decoder       = PE (positions) + 2E (LayerNorm) + layers, + E for a learned [MASK]
    relative bias = buckets x heads
    """
    m = cfg.model
    e, f, p, v = m.hidden_size, m.mlp_dim, m.max_positions, vocab
    layer = 4 * e * e + 2 * e * f + 9 * e + f
    cross_layer = 8 * e * e + 2 * e * f + 15 * e + f
    total = v * e + p * e + 2 * e + m.num_layers * layer + e * e + 3 * e + v
    total += m.relative_attention_buckets * m.num_heads
    if cfg.objective == "mae_lm":
        per_layer = layer if m.decoder == "self" else cross_layer
        total += p * e + 2 * e + m.num_decoder_layers * per_layer
        total += e if m.mask_token_source == "learned" else 0
    return total


@pytest.mark.parametrize(
    "config_module",
    [
        mlm_base,
        mlm_large,
        mae_lm_base,
        mae_lm_large,
        three_ml_self_base,
        three_ml_self_large,
        three_ml_cross_base,
        three_ml_cross_large,
    ],
)
def test_paper_config_parameter_counts(config_module):
    cfg = config_module.get_config()
    run = configdict.freeze(cfg)
    model = MaskedLM(run.model, pad_id=PAD_ID)
    k = run.masking.num_masked
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), *init_inputs(cfg.seq_len, k))
    assert count_params(nn.unbox(shapes["params"])) == expected_params(cfg)


def test_base_encoder_size_is_roberta_base():
    """RoBERTa-base's encoder with our 32k vocab: ~111M; the MAE-LM decoder adds ~29M."""
    cfg = mlm_base.get_config()
    assert 110e6 < expected_params(cfg) < 112e6
    assert 139e6 < expected_params(mae_lm_base.get_config()) < 141e6


def documents_batch(seed, doc_lengths):
    """Rows of `<s>` + documents each ended by `</s>`, as packing builds them, then padding."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(doc_lengths), SEQ), PAD_ID, np.int32)
    for row, lengths in enumerate(doc_lengths):
        tokens = [BOS_ID]
        for n in lengths:
            tokens += [*rng.integers(FIRST_REGULAR_ID, 300, n), EOS_ID]
        ids[row, : len(tokens)] = tokens
    return ids


@pytest.mark.parametrize(
    "objective,decoder,decoder_bias",
    [
        ("mlm", "self", False),
        ("mae_lm", "self", False),
        ("mae_lm", "cross", False),
        ("mae_lm", "self", True),
        ("mae_lm", "cross", True),
    ],
)
def test_a_document_changes_no_output_of_another_document(objective, decoder, decoder_bias):
    """Every token of document 2 replaced: nothing of documents 1 and 3 moves (encoder
    outputs, the decoders' and MLM's logits), while it does under packing="concatenated";
    also with the decoders' own relative bias."""
    ids = documents_batch(0, [[9, 8, 6], [4, 12, 8], [13, 9, 2], [6, 10, 3]])
    changed = ids.copy()
    doc2 = np.cumsum(ids == EOS_ID, axis=1) - (ids == EOS_ID) == 1
    doc2 &= ids >= FIRST_REGULAR_ID
    changed[doc2] = np.random.default_rng(1).integers(FIRST_REGULAR_ID, 300, doc2.sum())
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=decoder_bias)
    _, params, _ = build(objective, decoder, **bias)
    segments = np.asarray(segment_ids(jnp.asarray(ids), EOS_ID, PAD_ID, "segmented"))
    for packing in ("segmented", "concatenated"):
        c = tiny_config(objective, decoder, SEQ, **bias)
        c.packing = packing
        model_cfg, mask_cfg = frozen(c)
        model = MaskedLM(model_cfg, pad_id=PAD_ID)
        batch = masking.mask_batch(jax.random.PRNGKey(3), jnp.asarray(ids), mask_cfg)
        other = masking.mask_batch(jax.random.PRNGKey(3), jnp.asarray(changed), mask_cfg)
        np.testing.assert_array_equal(other.masked_idx, batch.masked_idx)
        logits, inter = run(model, params, batch)
        logits2, inter2 = run(model, params, other)
        slot_docs = np.take_along_axis(segments, np.asarray(batch.masked_idx), axis=1)
        outputs = [(np.asarray(logits), np.asarray(logits2), slot_docs)]
        if objective == "mae_lm":
            visible_docs = np.take_along_axis(segments, np.asarray(batch.visible_idx), axis=1)
            encoded = inter["encoder_output"][0], inter2["encoder_output"][0]
            outputs.append((np.asarray(encoded[0]), np.asarray(encoded[1]), visible_docs))
        for before, after, docs in outputs:
            others = (docs != 2) & (docs != 0)
            assert (docs == 2).any() and others.sum() > 10
            if packing == "segmented":
                np.testing.assert_allclose(after[others], before[others], atol=1e-6, rtol=0)
            else:
                assert not np.allclose(after[others], before[others], atol=1e-4)
            assert not np.allclose(after[docs == 2], before[docs == 2], atol=1e-4)


def test_attention_dropout_is_active_in_training_and_off_in_eval():
    off = dict(dropout_rate=0.0, decoder_dropout_rate=0.0)
    model, params, batch = build("mae_lm", "self", **off, attention_dropout_rate=0.0)

    def outputs(model, rng=None):
        """(encoder output, logits) in training mode with `rng`, else in eval mode."""
        logits, state = model.apply(
            {"params": params},
            batch.input_ids,
            batch.masked_idx,
            batch.visible_idx,
            deterministic=rng is None,
            segment_ids=batch.segment_ids,
            rngs={} if rng is None else {"dropout": rng},
            mutable=["intermediates"],
        )
        return np.asarray(state["intermediates"]["encoder_output"][0]), np.asarray(logits)

    plain = outputs(model)
    for got, want in zip(outputs(model, jax.random.PRNGKey(0)), plain, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)  # rate 0: nothing dropped
    # (rates, which output attention dropout moves: 0 = encoder output, 1 = logits)
    for rates, moved in (
        (dict(attention_dropout_rate=0.3), 0),
        (dict(attention_dropout_rate=0.0, decoder_attention_dropout_rate=0.3), 1),
    ):
        cfg = frozen(tiny_config("mae_lm", "self", SEQ, **off, **rates))[0]
        dropped = MaskedLM(cfg, pad_id=PAD_ID)
        for got, want in zip(outputs(dropped), plain, strict=True):
            np.testing.assert_allclose(got, want, atol=1e-6)  # eval: no dropout
        first = outputs(dropped, jax.random.PRNGKey(0))
        second = outputs(dropped, jax.random.PRNGKey(1))
        assert np.abs(first[moved] - plain[moved]).max() > 1e-4
        assert np.abs(first[moved] - second[moved]).max() > 1e-4
        if moved == 1:  # the decoder's rate leaves the encoder alone
            np.testing.assert_allclose(first[0], plain[0], atol=1e-6)


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_local_relative_init_makes_a_slot_read_its_neighbours_first(decoder):
    """With the local prior on the decoder's own bias only (the default's choice: the encoder
    starts at the official init), an untrained decoder's [MASK] slot already depends far
    more on the token next to it than on a distant one; with the official init both pull
    about equally (attention starts uniform)."""
    base = dict(relative_attention_buckets=16, relative_attention_max_distance=32)
    base.update(dropout_rate=0.0, attention_dropout_rate=0.0)
    ratios = {}
    for slope in (0.0, 2.0):
        model, params, batch = build(
            "mae_lm",
            decoder,
            decoder_relative_attention=slope > 0,
            decoder_relative_attention_init_slope=slope,
            **base,
        )
        masked = np.asarray(batch.masked_idx)
        visible = set(np.asarray(batch.visible_idx[0]).tolist())
        slot = next(
            j for j, p in enumerate(masked[0]) if p + 1 in visible and 1 <= p < SEQ // 2 - 2
        )
        near, pos = masked[0, slot] + 1, masked[0, slot]
        far = max(p for p in visible if p < SEQ - 1 and p > pos + 10)
        logits, _ = run(model, params, batch)
        effect = {}
        for name, where in (("near", near), ("far", far)):
            edited = np.array(batch.input_ids)
            edited[0, where] = FIRST_REGULAR_ID + (edited[0, where] - FIRST_REGULAR_ID + 50) % 200
            moved, _ = run(model, params, batch, jnp.asarray(edited))
            effect[name] = float(jnp.abs(moved[0, slot] - logits[0, slot]).max())
        assert effect["near"] > 0, (slope, effect)
        ratios[slope] = effect["near"] / max(effect["far"], 1e-12)  # far may round to 0
    assert ratios[2.0] > 20 and ratios[0.0] < 5, ratios


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_splash_attention_gives_the_xla_models_loss_and_gradients(decoder):
    """attention_impl="splash" (the Pallas kernel, interpreted on CPU) wherever there is no
    bias and no probability dropout; here the decoder, while the encoder keeps its relative
    bias on the XLA path. Same loss and gradients as the all-XLA model."""
    assert_splash_matches_xla(
        decoder, relative_attention_buckets=8, decoder_relative_attention=False
    )


def assert_splash_matches_xla(decoder, **overrides):
    """The MAE-LM model with attention_impl="splash" (interpreted) against the XLA one: the
    same loss and gradients, and the kernel in the program."""
    model, params, batch = build("mae_lm", decoder, **overrides)
    cfg = frozen(tiny_config("mae_lm", decoder, SEQ, attention_impl="splash", **overrides))[0]
    splash = MaskedLM(cfg.for_platform("cpu"), PAD_ID)
    assert splash.config.kernel_interpret
    rng = jax.random.PRNGKey(3)
    step = lambda m: jax.jit(grad_fn(m, deterministic=True))
    (want, _), grads_want = step(model)(params, batch, rng)
    splash_step = step(splash)
    (got, _), grads = splash_step(params, batch, rng)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert_trees_close(grads, grads_want, atol=1e-5, rtol=1e-4)
    hlo = splash_step.lower(params, batch, rng).as_text()  # the trace above, not a new one
    assert "splash" in hlo.lower() or "pallas" in hlo.lower()


@pytest.mark.parametrize("chunk", [0, 5])
def test_the_bias_gradient_summed_over_layers_is_each_layers_own_contracted(chunk):
    """relative_bias_grad="summed" (the GPU's: the layers' score gradients summed, then one
    contraction into the table) against "per_layer" (each layer contracts its own): the same
    loss and gradients, the encoder's and the decoder's bias tables included."""
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=True)
    model, params, batch = build("mae_lm", "self", attention_query_chunk=chunk, **bias)
    overrides = dict(bias, attention_query_chunk=chunk, relative_bias_grad="summed")
    summed = MaskedLM(frozen(tiny_config("mae_lm", "self", SEQ, **overrides))[0], PAD_ID)
    assert model.config.relative_bias_grad != "summed"  # "auto" off a device computes per layer
    rng = jax.random.PRNGKey(3)
    (want, _), grads_want = jax.jit(grad_fn(model, deterministic=True))(params, batch, rng)
    (got, _), grads = jax.jit(grad_fn(summed, deterministic=True))(params, batch, rng)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_trees_close(grads, grads_want, atol=1e-6, rtol=1e-4)
    for stack in ("encoder", "decoder"):  # tiny at init: held to their own scale
        table, table_want = (g[stack]["relative_bias"]["embedding"] for g in (grads, grads_want))
        scale = np.abs(table_want).max()
        assert scale > 0
        np.testing.assert_allclose(table, table_want, rtol=1e-4, atol=1e-4 * scale, err_msg=stack)


def test_the_bias_built_per_query_block_gives_the_once_per_stack_loss_and_gradients():
    """relative_bias_once=False (each layer's query blocks build the bias from the table, for
    the largest batches) against the default bias made once per stack: same loss and
    gradients, the encoder's and the decoder's bias tables included."""
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=True)
    model, params, batch = build("mae_lm", "cross", attention_query_chunk=5, **bias)
    overrides = dict(bias, attention_query_chunk=5, relative_bias_once=False)
    per_block = MaskedLM(frozen(tiny_config("mae_lm", "cross", SEQ, **overrides))[0], PAD_ID)
    assert model.config.relative_bias_once and not per_block.config.relative_bias_once
    rng = jax.random.PRNGKey(3)
    (want, _), grads_want = jax.jit(grad_fn(model, deterministic=True))(params, batch, rng)
    (got, _), grads = jax.jit(grad_fn(per_block, deterministic=True))(params, batch, rng)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_trees_close(grads, grads_want, atol=1e-6, rtol=1e-4)
    assert np.abs(grads["decoder"]["relative_bias"]["embedding"]).max() > 0


@pytest.mark.parametrize("decoder", ["self", "cross"])
def test_the_kept_tokens_padded_for_cudnn_give_the_same_loss_and_gradients(decoder):
    """encoder_length_multiple (8 where attention runs on cuDNN, which pads every layer's
    lengths to 8 otherwise): the encoder runs over the kept tokens and extra slots of their
    own segment, and every loss and gradient is the unpadded model's. The tiny model keeps
    24 of 32 tokens, so the test pads to a multiple of 5 (25 slots)."""
    bias = dict(relative_attention_buckets=8, decoder_relative_attention=False)
    model, params, batch = build("mae_lm", decoder, lengths=[30, 21, 12, 26], **bias)
    kept, multiple = batch.visible_idx.shape[1], 5
    for setting, platform, made in [(0, "gpu", 8), (0, "cpu", 1), (multiple, "gpu", multiple)]:
        overrides = dict(
            bias, attention_impl="auto", encoder_length_multiple=setting, dtype="bfloat16"
        )  # bfloat16: "auto" is cuDNN on a GPU for a 16-bit model alone
        cfg = frozen(tiny_config("mae_lm", decoder, SEQ, **overrides))[0]
        assert cfg.for_platform(platform).encoder_length_multiple == made
    padded = MaskedLM(dataclasses.replace(model.config, encoder_length_multiple=multiple), PAD_ID)
    rng = jax.random.PRNGKey(3)
    (want, _), grads_want = jax.jit(grad_fn(model, deterministic=True))(params, batch, rng)
    (got, _), grads = jax.jit(grad_fn(padded, deterministic=True))(params, batch, rng)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert_trees_close(grads, grads_want, atol=1e-6, rtol=1e-4)
    wide = f"x{kept + -kept % multiple}x{model.config.hidden_size}x"
    hlo = lambda m: jax.jit(grad_fn(m, deterministic=True)).lower(params, batch, rng).as_text()
    assert wide in hlo(padded) and wide not in hlo(model)
