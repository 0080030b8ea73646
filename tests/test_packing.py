"""Packing: every token once and in order, `<s>` per block, padding only at the end."""

import numpy as np
import pytest

from maelm_jax.data import tokenizer as tok
from maelm_jax.data.shard_writer import pack_documents


@pytest.mark.parametrize("seq_len", [2, 7, 16])
def test_packing_keeps_every_token_once_in_order(seq_len):
    rng = np.random.default_rng(seq_len)
    docs = [rng.integers(5, 100, size=rng.integers(0, 30)).tolist() for _ in range(50)]
    blocks = pack_documents(docs, seq_len)
    stream = [t for d in docs for t in [*d, tok.EOS_ID]]
    width = seq_len - 1
    assert blocks.dtype == np.int32
    assert blocks.shape == (-(-len(stream) // width), seq_len)
    assert (blocks[:, 0] == tok.BOS_ID).all()
    body = blocks[:, 1:].reshape(-1)
    assert body[: len(stream)].tolist() == stream
    assert (body[len(stream) :] == tok.PAD_ID).all()  # padding only after the last token


def test_packing_an_exact_multiple_adds_no_pad_block_and_max_blocks_truncates():
    docs = [[7] * 9, [8] * 4]  # 9 + 1 + 4 + 1 = 15 tokens = 3 chunks of 5
    blocks = pack_documents(docs, 6)
    assert blocks.tolist() == [[0, 7, 7, 7, 7, 7], [0, 7, 7, 7, 7, 2], [0, 8, 8, 8, 8, 2]]
    many = [[9] * 30] * 40
    assert (pack_documents(many, 6, max_blocks=3) == pack_documents(many, 6)[:3]).all()
    assert pack_documents([], 6).shape == (0, 6)


def test_segment_ids_of_packed_blocks_are_exactly_the_documents():
    """Derived from `</s>` alone, the segment ids of every block split the stream exactly
    where documents end, cut documents included."""
    import jax.numpy as jnp

    from maelm_jax.model.positions.segments import segment_ids

    rng = np.random.default_rng(0)
    docs = [rng.integers(5, 100, size=rng.integers(1, 12)).tolist() for _ in range(40)]
    blocks = pack_documents(docs, 16)
    seg = np.asarray(segment_ids(jnp.asarray(blocks), tok.EOS_ID, tok.PAD_ID, "segmented"))
    doc_of = np.concatenate([[i] * (len(d) + 1) for i, d in enumerate(docs)])
    body = seg[:, 1:].reshape(-1)[: len(doc_of)]
    block_of = np.arange(len(doc_of)) // 15
    for b in range(len(blocks)):
        here = block_of == b
        pairs = set(zip(doc_of[here].tolist(), body[here].tolist(), strict=True))
        assert len(pairs) == len({d for d, _ in pairs}) == len({s for _, s in pairs})
        assert seg[b, 0] == body[here][0]  # <s> belongs to the block's first document
    assert (seg.reshape(-1)[blocks.reshape(-1) == tok.PAD_ID] == 0).all()
