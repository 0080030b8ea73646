"""A corpus prepared once for every run: the TFDS dataset built into `data_dir`, the
SentencePiece model trained on a sample of its training documents, the whole corpus
tokenized and packed into shards of `seq_len` blocks (`shard_writer`), and its statistics,
stored next to the data (`prepared` has the layout). Training hosts then find them instead
of building them: `tokenizer.load_or_train` copies the prepared model into the workdir and
`input_pipeline` maps the shards, for any method, size or workdir.

Each stage is built once (`prepared.build_once`: processes started at once wait for the
first), and a rerun changes nothing unless a shard is missing or changed, which it rebuilds.
Statistics are over the training documents (eval held out), counted from the shards:
documents, tokens (without `<s>`/`</s>`), distinct tokens, and the unigram entropy of the
token distribution in bits per token.
"""

import itertools
import json
import os
import time

import tensorflow_datasets as tfds
from absl import logging

from maelm_jax.data import default_corpus, prepared, shard_writer, shards
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.documents import TEXT_PREFIX, read_documents
from maelm_jax.run_config import ConfigError, DataConfig

NUM_SHARDS = 16  # divides the process count of pods up to 16 hosts; more hosts, more shards


def beam_download_config(beam_options: str | None):
    """What TFDS's Apache Beam builders (wikipedia, c4) run their pipeline with, from
    options written as `tfds build --beam_pipeline_options` takes them:
    "runner=DirectRunner,direct_num_workers=8" on this machine, "runner=DataflowRunner,
    project=P,region=R,temp_location=gs://..." on Dataflow. None: TFDS's default."""
    if not beam_options:
        return None
    try:
        from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise ConfigError(
            f"--beam_options={beam_options!r} needs Apache Beam: pip install -e '.[beam]' "
            "(apache-beam[gcp] for Dataflow)"
        ) from None
    flags = [f"--{option.strip()}" for option in beam_options.split(",") if option.strip()]
    return tfds.download.DownloadConfig(beam_options=PipelineOptions(flags=flags))


def prepare_source(config: DataConfig, beam_options: str | None = None) -> None:
    """Builds the TFDS dataset into data_dir if it is not there (a Beam builder with
    `beam_options`); text files need nothing."""
    if config.dataset.startswith(TEXT_PREFIX):
        return
    if config.dataset == default_corpus.NAME:
        default_corpus.builder(config.data_dir)
        return
    builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    if not builder.is_prepared():
        logging.info("Preparing %s into %s", config.dataset, builder.data_dir_root)
        builder.download_and_prepare(download_config=beam_download_config(beam_options))


def _build_tokenizer(config: DataConfig, beam_options: str | None) -> None:
    prepare_source(config, beam_options)
    docs = itertools.islice(read_documents(config, "train", 0, 1), config.tokenizer_train_documents)
    prepared.write_atomically(
        prepared.tokenizer_path(config), tokenizer_lib.train(docs, config.vocab_size)
    )


def prepare(
    config: DataConfig,
    num_shards: int = NUM_SHARDS,
    workers: int | None = None,
    max_eval_blocks: int = shard_writer.MAX_EVAL_BLOCKS,
    beam_options: str | None = None,
) -> dict:
    """Prepares `config`'s data once (see the module doc) with `workers` processes (None:
    one per core; `beam_options` for a TFDS Beam builder); the statistics with where
    everything lives, the packing job's numbers and whether this call built anything."""
    start = time.perf_counter()
    built = prepared.build_once(
        prepared.tokenizer_path(config), lambda: _build_tokenizer(config, beam_options)
    )
    model = prepared.tokenizer_path(config).read_bytes()
    blocks_dir = prepared.blocks_directory(config, num_shards)
    repaired = shard_writer.remove_bad(blocks_dir, config)
    workers = workers or os.cpu_count() or 1
    built |= prepared.build_once(
        blocks_dir / shards.MANIFEST_FILENAME,
        lambda: shard_writer.build(config, model, blocks_dir, num_shards, workers, max_eval_blocks),
    )
    manifest = shards.read_manifest(blocks_dir)
    if not prepared.statistics_path(config).exists():  # the same for every seq_len
        stats = {
            "dataset": config.dataset,
            "vocab_size": manifest["vocab_size"],
            "tokenizer_sha256": manifest["tokenizer_sha256"],
            **manifest["statistics"],
            "seconds": round(time.perf_counter() - start, 1),
        }
        prepared.write_atomically(
            prepared.statistics_path(config), (json.dumps(stats, indent=1) + "\n").encode()
        )
    if built:
        logging.info("Prepared %s in %.1fs", blocks_dir, time.perf_counter() - start)
    stats = json.loads(prepared.statistics_path(config).read_text())
    job = manifest["build"]
    return {
        **stats,
        "seq_len": config.seq_len,
        "blocks": sum(e["blocks"] for e in manifest["splits"]["train"]),
        "eval_blocks": sum(e["blocks"] for e in manifest["splits"]["eval"]),
        "dtype": manifest["dtype"],
        "num_shards": num_shards,
        "prepared_dir": str(prepared.directory(config)),
        "blocks_dir": str(blocks_dir),
        "tokenizer": str(prepared.tokenizer_path(config)),
        "pack_seconds": job["seconds"],
        "pack_workers": job["workers"],
        "text_bytes": job["text_bytes"],
        "repaired": repaired,
        "built": built,
    }
