"""Training data the fairseq way: tokenize and pack once, then draw any step's batch directly.

The entry point that ties the stages together for one process. Its blocks come from a
corpus `prepare_data` tokenized and packed for every run (`shards`: this process's shards,
memory-mapped, when one matches the run's tokenizer and seq_len), or else from its share of
the documents (`documents`), tokenized, packed and cached once per workdir (`packing`). Either
way they are served as step-addressed batches (`batches`), so a resumed run reloads the same
blocks and replays exactly the batches an uninterrupted run would have seen.
"""

import dataclasses
import os

import numpy as np
from absl import logging

from maelm_jax.data import packing, shards
from maelm_jax.data.batches import TrainBatches, eval_batches
from maelm_jax.data.documents import prepare_dataset
from maelm_jax.data.packing import packed_blocks
from maelm_jax.data.tokenizer import PAD_ID, Tokenizer
from maelm_jax.run_config import ConfigError, DataConfig


@dataclasses.dataclass(frozen=True)
class Datasets:
    """This process's data: train batches, the fixed eval batches and their sizes (blocks and
    non-pad tokens, `<s>`/`</s>` included; the eval counts exclude padding rows)."""

    train: TrainBatches
    eval: list[np.ndarray]
    train_blocks: int
    train_tokens: int
    eval_blocks: int
    eval_tokens: int


def local_batch_size(config: DataConfig, process_count: int) -> int:
    """Rows per process; ConfigError unless `config.batch_size` splits evenly."""
    if config.batch_size % process_count:
        raise ConfigError(
            f"batch_size={config.batch_size} is not divisible by the process count "
            f"{process_count}; use a multiple of {process_count}"
        )
    return config.batch_size // process_count


def _non_pad_tokens(blocks: np.ndarray) -> int:
    return int(np.count_nonzero(np.asarray(blocks) != PAD_ID))


def _prepared_blocks(found, config: DataConfig, process_index: int, process_count: int):
    """(train blocks, their non-pad tokens, eval blocks) of this process's prepared shards:
    mapped, not read, so memory and startup stay flat however large the corpus."""
    directory, manifest = found
    if process_index == 0:
        logging.info("Reading the prepared corpus %s (tokenizing nothing)", directory)
    train, tokens = shards.open_share(
        directory, manifest, "train", process_index, process_count, config
    )
    evals, _ = shards.open_share(directory, manifest, "eval", process_index, process_count, config)
    return train, tokens, evals


def _cached_blocks(config, workdir, tokenizer, process_index: int, process_count: int):
    """(train, eval blocks) tokenized from the documents, cached once per workdir."""
    prepare_dataset(config, process_index)
    train = packed_blocks(config, workdir, tokenizer, "train", process_index, process_count)
    rows = config.eval_batches * local_batch_size(config, process_count)
    evals = np.zeros((0, config.seq_len), np.int32)
    if rows and len(train):
        evals = packed_blocks(
            config, workdir, tokenizer, "eval", process_index, process_count, max_blocks=rows
        )
    return train, evals


def create_datasets(
    config: DataConfig,
    workdir: str | os.PathLike,
    tokenizer: Tokenizer,
    process_index: int,
    process_count: int,
) -> Datasets:
    """This process's prepared shards if a matching prepared corpus exists (and the workdir
    has not begun on its own cache); else it reads, tokenizes, packs and caches its share,
    once per workdir (a resumed run loads the cache).
    Collective: every process calls it (it may prepare the dataset)."""
    batch_size = local_batch_size(config, process_count)
    if not config.eval_split and config.eval_batches > 0 and config.eval_holdout_fraction <= 0:
        raise ConfigError(
            f"eval_holdout_fraction={config.eval_holdout_fraction} with eval_split='' leaves "
            "no eval documents; set a fraction in (0, 1), an eval_split, or eval_batches=0"
        )
    rows = config.eval_batches * batch_size
    found = None
    if not packing.is_cached(config, workdir, tokenizer, process_index, process_count):
        found = shards.find(config, tokenizer.fingerprint, process_count)
    if found is not None:
        train, train_tokens, evals = _prepared_blocks(found, config, process_index, process_count)
        if len(evals) < rows and process_index == 0:
            logging.warning(
                "The prepared eval split gives process 0 %d blocks for %d eval rows; the rest "
                "are padding (no weight)",
                len(evals),
                rows,
            )
        evals = np.asarray(evals[np.arange(min(rows, len(evals)))], np.int32)
    else:
        train, evals = _cached_blocks(config, workdir, tokenizer, process_index, process_count)
        train_tokens = _non_pad_tokens(train)
    if len(train) == 0:
        raise ConfigError(
            f"dataset={config.dataset!r} (train_split={config.train_split!r}) gave process "
            f"{process_index} of {process_count} no tokens: the corpus is empty or too small"
        )
    if process_index == 0:
        logging.info(
            "Data on process 0 of %d: %d train blocks, %d eval blocks of %d tokens",
            process_count,
            len(train),
            len(evals),
            config.seq_len,
        )
    return Datasets(
        train=TrainBatches(train, batch_size, config.seed, process_index),
        eval=eval_batches(evals, config.eval_batches, batch_size),
        train_blocks=len(train),
        train_tokens=train_tokens,
        eval_blocks=len(evals),
        eval_tokens=_non_pad_tokens(evals),
    )
