"""A corpus prepared once for every run: the TFDS dataset built into `data_dir`, the
SentencePiece model trained on a sample of its training documents, and its statistics,
stored next to the data (`prepared` has the layout). Training hosts then find them instead
of building them (`tokenizer.load_or_train` copies the prepared model into the workdir).

A rerun finds `statistics.json` and changes nothing; processes started at once build it
once (`prepared.build_once`). Statistics are over the training documents (eval held out):
documents, tokens (without `<s>`/`</s>`), blocks of `seq_len` as FULL-SENTENCES packing
cuts them (each document plus `</s>`, in chunks of seq_len - 1 after `<s>`), and the unigram
entropy of the token distribution in bits per token.
"""

import collections
import itertools
import json
import math
import time

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from maelm_jax.data import default_corpus, prepared
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.documents import TEXT_PREFIX, read_documents
from maelm_jax.run_config import ConfigError, DataConfig

_ENCODE_BATCH = 512


def prepare_source(config: DataConfig) -> None:
    """Builds the TFDS dataset into data_dir if it is not there; text files need nothing."""
    if config.dataset.startswith(TEXT_PREFIX):
        return
    if config.dataset == default_corpus.NAME:
        default_corpus.builder(config.data_dir)
        return
    builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    if not builder.is_prepared():
        logging.info("Preparing %s into %s", config.dataset, builder.data_dir_root)
        builder.download_and_prepare()


def corpus_statistics(config: DataConfig, tokenizer: tokenizer_lib.Tokenizer) -> dict:
    """Counts over the training documents, as one process reads them all."""
    counts: collections.Counter = collections.Counter()
    documents = tokens = 0
    docs = read_documents(config, "train", 0, 1)
    while batch := list(itertools.islice(docs, _ENCODE_BATCH)):
        for ids in tokenizer.encode_batch(batch):
            counts.update(ids)
            tokens += len(ids)
        documents += len(batch)
    if not tokens:
        raise ConfigError(f"dataset={config.dataset!r} has no training text")
    p = np.array(list(counts.values()), np.float64) / tokens
    return {
        "documents": documents,
        "tokens": tokens,
        "distinct_tokens": len(counts),
        "unigram_entropy_bits": float(-(p * np.log2(p)).sum()),
    }


def blocks(statistics: dict, seq_len: int) -> int:
    """Blocks of `seq_len` the whole stream packs into (one process; more hosts pad a little)."""
    return math.ceil((statistics["tokens"] + statistics["documents"]) / (seq_len - 1))


def _build(config: DataConfig) -> None:
    start = time.perf_counter()
    prepare_source(config)
    docs = itertools.islice(read_documents(config, "train", 0, 1), config.tokenizer_train_documents)
    model = tokenizer_lib.train(docs, config.vocab_size)
    tokenizer = tokenizer_lib.Tokenizer(model)
    stats = {
        "dataset": config.dataset,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_sha256": tokenizer.fingerprint,
        **corpus_statistics(config, tokenizer),
        "seconds": round(time.perf_counter() - start, 1),
    }
    prepared.write_atomically(prepared.tokenizer_path(config), model)
    prepared.write_atomically(
        prepared.statistics_path(config), (json.dumps(stats, indent=1) + "\n").encode()
    )


def prepare(config: DataConfig) -> dict:
    """Prepares `config`'s data once (see the module doc); the statistics, for this seq_len,
    with where they live and whether this call built them."""
    built = prepared.build_once(prepared.statistics_path(config), lambda: _build(config))
    stats = json.loads(prepared.statistics_path(config).read_text())
    return {
        **stats,
        "seq_len": config.seq_len,
        "blocks": blocks(stats, config.seq_len),
        "prepared_dir": str(prepared.directory(config)),
        "tokenizer": str(prepared.tokenizer_path(config)),
        "built": built,
    }
