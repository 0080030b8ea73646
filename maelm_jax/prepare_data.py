"""`python -m maelm_jax.prepare_data --config=configs/<name>.py [--data_dir=gs://...] [--json]`.

Run once, on one machine, before a pod is launched: prepares the config's TFDS dataset into
`data_dir`, trains the SentencePiece model on a sample of the training documents and stores
it next to the data (`maelm_jax.prepared` has the layout), and writes the corpus statistics.
Training hosts then find the prepared dataset and tokenizer instead of building them
(`tokenizer.load_or_train` copies the prepared model into the workdir).

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
from absl import app, flags, logging
from ml_collections import config_flags

from maelm_jax import cli, paths
from maelm_jax.configuration import ConfigError, DataConfig, data_config
from maelm_jax.data import default_corpus, prepared
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.documents import TEXT_PREFIX, read_documents

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


def format_report(r: dict) -> str:
    rows = [
        ("dataset", r["dataset"]),
        ("prepared in", r["prepared_dir"]),
        ("this run", "built it" if r["built"] else "already prepared: nothing done"),
        ("tokenizer", f"{r['vocab_size']} pieces, sha256 {r['tokenizer_sha256'][:12]}"),
        ("documents", f"{r['documents']:,}"),
        ("tokens", f"{r['tokens']:,} ({r['tokens'] / r['documents']:,.0f} per document)"),
        (f"blocks of {r['seq_len']}", f"{r['blocks']:,}"),
        ("unigram entropy", f"{r['unigram_entropy_bits']:.3f} bits/token"),
        ("distinct tokens", f"{r['distinct_tokens']:,}"),
    ]
    return "\n".join(f"{k:<16} {v}" for k, v in rows)


FLAGS = flags.FLAGS


def define_flags() -> None:
    """Called by `__main__` only, so tests can import this module beside other commands."""
    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_string("data_dir", None, "Replaces config.data_dir (local, file:// or gs://).")
    flags.DEFINE_boolean("json", False, "Print one JSON object instead of the table.")
    flags.mark_flags_as_required(["config"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = FLAGS.config
    if FLAGS.data_dir:
        config.data_dir = paths.resolve(FLAGS.data_dir)
    report = prepare(data_config(config))
    print(json.dumps(report) if FLAGS.json else format_report(report))


if __name__ == "__main__":
    define_flags()
    cli.run(main, prog="maelm_jax.prepare_data")
