"""A corpus prepared once for every run: the TFDS dataset built into `data_dir`, the
SentencePiece model trained on a sample of its training documents, the whole corpus
tokenized and packed into shards of `seq_len` blocks (`shard_writer`), and its statistics,
stored next to the data (`prepared` has the layout). `python -m maelm_jax.prepare_data` runs
it ahead of time; a training run whose corpus is not prepared yet runs the same stages itself
(`input_pipeline`), so every run reads its blocks one way, from shards.

Each stage is built once (`prepared.build_once`: processes started at once wait for the
first), and a rerun changes nothing unless a shard is missing or changed, which it rebuilds.
Statistics are over the training documents (eval held out), counted from the shards:
documents, tokens (without `<s>`/`</s>`), distinct tokens, and the unigram entropy of the
token distribution in bits per token.
"""

import itertools
import json
import time

import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from maelm_jax.config.run_config import ConfigError, DataConfig
from maelm_jax.data import default_corpus, documents, prepared, shard_writer, shards
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.hardware import host_cpus

NUM_SHARDS = 16  # divides the process count of pods up to 16 hosts; more hosts, more shards
# Source text per packing process: a spawned worker costs seconds to start (it imports
# TensorFlow), about what one core packs of this much text (`bench input`: ~1 MB/s per core).
_BYTES_PER_WORKER = 16 << 20


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


def prepare_source(
    config: DataConfig, beam_options: str | None = None, download: bool = True
) -> None:
    """Builds the TFDS dataset into data_dir if it is not there (a Beam builder with
    `beam_options`); text files need nothing, the embedded corpus is always built. Without
    `download` (a training run) a TFDS dataset must already be there: `read_documents` says
    how to build it."""
    documents.refuse_study_corpus(config.dataset)
    if config.dataset.startswith(documents.TEXT_PREFIX):
        return
    if config.dataset == default_corpus.NAME:
        default_corpus.builder(config.data_dir)
        return
    if not download:
        return
    builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    if not builder.is_prepared():
        logging.info("Preparing %s into %s", config.dataset, builder.data_dir_root)
        builder.download_and_prepare(download_config=beam_download_config(beam_options))


def shard_count(process_count: int) -> int:
    """What a run prepares for itself: NUM_SHARDS, or the least multiple of the process
    count past it, so that every process reads as many shards."""
    return process_count * -(-NUM_SHARDS // process_count)


def _workers(config: DataConfig, num_shards: int) -> int:
    """One packing process per `_BYTES_PER_WORKER` of source text, at most one per core
    and one per shard: a small corpus packs in this process, without spawning any."""
    size = documents.source_bytes(config)
    cores = host_cpus.usable_cpus()
    if size is None:
        return min(cores, num_shards)
    return max(1, min(cores, num_shards, size // _BYTES_PER_WORKER))


def _build_tokenizer(config: DataConfig, beam_options: str | None, download: bool) -> None:
    prepare_source(config, beam_options, download)
    docs = documents.read_documents(config, "train", 0, 1)
    docs = itertools.islice(docs, config.tokenizer_train_documents)
    start = time.perf_counter()
    model = tokenizer_lib.train(docs, config.vocab_size)
    prepared.write_atomically(prepared.tokenizer_path(config), model)
    logging.info(
        "Trained a %d-piece tokenizer in %.1fs; saved to %s",
        tokenizer_lib.Tokenizer(model).vocab_size,
        time.perf_counter() - start,
        prepared.tokenizer_path(config),
    )


def prepare_tokenizer(
    config: DataConfig, beam_options: str | None = None, download: bool = True
) -> bytes:
    """The corpus's own SentencePiece model, trained once on its first
    `tokenizer_train_documents` training documents."""
    _tokenizer_once(config, beam_options, download)
    return prepared.tokenizer_path(config).read_bytes()


def _tokenizer_once(config: DataConfig, beam_options: str | None, download: bool) -> bool:
    return prepared.build_once(
        prepared.tokenizer_path(config), lambda: _build_tokenizer(config, beam_options, download)
    )


def prepare_blocks(
    config: DataConfig,
    model: bytes,
    num_shards: int = NUM_SHARDS,
    workers: int | None = None,
    max_eval_blocks: int = shard_writer.MAX_EVAL_BLOCKS,
    beam_options: str | None = None,
    download: bool = True,
) -> tuple[epath.Path, bool, list[str]]:
    """Packs the corpus with tokenizer `model` into `num_shards` shards once: (their
    directory, whether this call built them, the shards found missing or changed and
    rebuilt), with `workers` processes (None: by the source's size, see `_workers`)."""
    fingerprint = tokenizer_lib.Tokenizer(model).fingerprint
    own = prepared.tokenizer_path(config)
    other = None
    if not own.exists() or tokenizer_lib.Tokenizer(own.read_bytes()).fingerprint != fingerprint:
        other = fingerprint
    blocks_dir = prepared.blocks_directory(config, num_shards, other)
    repaired = shard_writer.remove_bad(blocks_dir, config)

    def build():
        prepare_source(config, beam_options, download)
        count = workers or _workers(config, num_shards)
        shard_writer.build(config, model, blocks_dir, num_shards, count, max_eval_blocks)

    built = prepared.build_once(blocks_dir / shards.MANIFEST_FILENAME, build)
    return blocks_dir, built, repaired


def prepare(
    config: DataConfig,
    num_shards: int = NUM_SHARDS,
    workers: int | None = None,
    max_eval_blocks: int = shard_writer.MAX_EVAL_BLOCKS,
    beam_options: str | None = None,
) -> dict:
    """Prepares `config`'s data once (see the module doc) with `workers` processes (None:
    by the source's size; `beam_options` for a TFDS Beam builder); the statistics with where
    everything lives, the packing job's numbers and whether this call built anything."""
    start = time.perf_counter()
    built = _tokenizer_once(config, beam_options, download=True)
    model = prepared.tokenizer_path(config).read_bytes()
    blocks_dir, built_blocks, repaired = prepare_blocks(
        config, model, num_shards, workers, max_eval_blocks, beam_options
    )
    built |= built_blocks
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
