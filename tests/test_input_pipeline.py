"""create_datasets: shapes, token counts, eval padding, the corpus prepared once, bad input."""

import os

import numpy as np
import pytest
from text_corpora import data_config, sample_corpus, sample_document, write_corpus

from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import prepared, shards
from maelm_jax.data import tokenizer as tok
from maelm_jax.data.documents import read_documents
from maelm_jax.data.input_pipeline import create_datasets, load_tokenizer
from maelm_jax.data.preparation import NUM_SHARDS
from maelm_jax.data.shard_writer import pack_documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return sample_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return tok.Tokenizer(tok.train(corpus[1], 320))


def _documents_of(blocks: np.ndarray) -> list[list[int]]:
    """Inverse of packing: drop each block's <s>, join, cut at </s>, drop trailing pads."""
    assert (blocks[:, 0] == tok.BOS_ID).all()
    stream = blocks[:, 1:].reshape(-1).tolist()
    while stream and stream[-1] == tok.PAD_ID:
        stream.pop()
    assert stream[-1] == tok.EOS_ID
    docs, current = [], []
    for t in stream:
        if t == tok.EOS_ID:
            docs.append(current)
            current = []
        else:
            current.append(t)
    return docs


def test_create_datasets_shapes_tokens_and_eval_padding(corpus, tokenizer):
    pattern, _ = corpus
    c = data_config(pattern, eval_batches=40)
    data = create_datasets(c, tokenizer, process_index=1, process_count=2)
    assert data.train.batch(0).shape == (2, 16)
    # Process 1 of 2 maps the odd shards of the corpus, each shard i the packed documents
    # that a process i of NUM_SHARDS would read.
    mine = range(1, NUM_SHARDS, 2)
    train_docs = [d for i in mine for d in read_documents(c, "train", i, NUM_SHARDS)]
    by_shard = [_documents_of(np.asarray(a)) for a in data.train.blocks.arrays]
    assert [d for docs in by_shard for d in docs] == tokenizer.encode_batch(train_docs)
    expected_tokens = sum(len(tokenizer.encode(d)) + 1 for d in train_docs)
    assert data.train_tokens == expected_tokens + data.train_blocks  # + one <s> per block
    assert len(data.eval) == 40 and all(b.shape == (2, 16) for b in data.eval)
    rows = np.concatenate(data.eval)
    real, padding = rows[: data.eval_blocks], rows[data.eval_blocks :]
    assert len(padding) and (padding == tok.PAD_ID).all()
    expected = [
        pack_documents(tokenizer.encode_batch(list(read_documents(c, "eval", i, NUM_SHARDS))), 16)
        for i in mine
    ]
    assert (real == np.concatenate(expected)).all()
    c = data_config(pattern, eval_batches=3)  # fewer rows than the eval blocks: the first ones
    few = create_datasets(c, tokenizer, process_index=1, process_count=2)
    assert (np.concatenate(few.eval) == real[:6]).all()


def test_the_corpus_is_prepared_once_beside_the_data(tokenizer, tmp_path):
    docs = [sample_document(i) for i in range(100, 130)]
    pattern = write_corpus(tmp_path / "corpus", docs)
    c = data_config(pattern, data_dir=str(tmp_path / "data"))
    first = create_datasets(c, tokenizer, 0, 1)
    found = shards.find(c, tokenizer.fingerprint, 1)
    assert found is not None and found[0].parent == prepared.directory(c)
    manifest = found[0] / shards.MANIFEST_FILENAME
    written = os.stat(manifest).st_mtime_ns
    second = create_datasets(c, tokenizer, 0, 1)  # maps, builds nothing
    assert (np.asarray(second.train.blocks) == np.asarray(first.train.blocks)).all()
    assert os.stat(manifest).st_mtime_ns == written
    c = data_config(pattern, data_dir=str(tmp_path / "data"), seq_len=12)  # one more length
    assert create_datasets(c, tokenizer, 0, 1).train.blocks.shape[1] == 12
    assert len(list(prepared.directory(c).glob("blocks-seq*"))) == 2


def test_empty_corpus_is_a_config_error(tokenizer, tmp_path):
    (tmp_path / "blank.txt").write_text("\n\n   \n\t\n")
    c = data_config(f"text:{tmp_path}/*.txt")
    with pytest.raises(ConfigError, match=r"blank|\*\.txt"):
        create_datasets(c, tokenizer, 0, 1)
    with pytest.raises(ConfigError, match=r"\*\.txt"):
        load_tokenizer(c, tmp_path / "work")


def test_batch_size_not_divisible_by_process_count_is_a_config_error(corpus, tokenizer):
    c = data_config(corpus[0], batch_size=10)
    with pytest.raises(ConfigError, match=r"batch_size=10.*\b3\b"):
        create_datasets(c, tokenizer, 0, 3)


def test_no_eval_documents_is_a_config_error(corpus, tokenizer):
    c = data_config(corpus[0], eval_holdout_fraction=0.0)
    with pytest.raises(ConfigError, match=r"eval_holdout_fraction=0\.0"):
        create_datasets(c, tokenizer, 0, 1)
