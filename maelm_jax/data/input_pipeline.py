"""Training data the fairseq way: tokenize and pack once, then draw any step's batch directly.

The entry point that ties the stages together for one process, one way through:
source -> documents -> tokenizer -> shards -> batches. The tokenizer is the workdir's (a
resumed run) or the corpus's own, trained once (`load_tokenizer`); the blocks are this
process's shards of the corpus packed with it, memory-mapped. When the corpus has not been
prepared (`python -m maelm_jax.prepare_data`), the run prepares it first, once, into the
same place (`preparation`), so the next run, of any method or size, starts at once. The
blocks are served as step-addressed batches (`batches`), so a resumed run replays exactly
the batches an uninterrupted run would have seen.
"""

import dataclasses
import functools
import os

import jax
import numpy as np
from absl import logging

from maelm_jax.config import paths
from maelm_jax.config.run_config import ConfigError, DataConfig
from maelm_jax.data import prepared, shards
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.batches import TrainBatches, eval_batches
from maelm_jax.data.preparation import prepare_blocks, prepare_tokenizer, shard_count
from maelm_jax.data.tokenizer import PAD_ID, Tokenizer
from maelm_jax.hardware import multihost


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


def load_tokenizer(config: DataConfig, workdir: str | os.PathLike) -> Tokenizer:
    """The run's tokenizer: `config.vocab_path` if set, else `WORKDIR/tokenizer.model` (a
    resumed run reuses it), else the corpus's own, trained once next to the data and copied
    into the workdir, which checkpoints and exports read.

    Collective: every process calls it. Process 0 prepares and copies while the others
    wait, then all load the same file, so the workdir must be storage every host sees. If
    process 0 fails, every process raises.
    """
    if config.vocab_path:
        return tokenizer_lib.from_vocab_path(config.vocab_path)
    path = paths.path(workdir) / tokenizer_lib.MODEL_FILENAME
    error = None
    if jax.process_index() == 0 and not path.exists():
        try:
            prepared.write_atomically(path, prepare_tokenizer(config, download=False))
            logging.info("Using the prepared tokenizer %s", prepared.tokenizer_path(config))
        except ConfigError as e:
            error = e
    # Also the barrier: nobody reads the file before process 0 has written it.
    multihost.raise_together(error, "preparing the tokenizer")
    if not path.exists():
        raise ConfigError(
            f"process {jax.process_index()} cannot see {path}, written by process 0; "
            f"workdir={os.fspath(workdir)!r} must be storage every host shares (e.g. gs://)"
        )
    return Tokenizer.from_path(path)


def _shards(config: DataConfig, tokenizer: Tokenizer, process_index: int, process_count: int):
    """(directory, manifest) of the corpus packed with `tokenizer`, prepared now if it is
    not yet. Collective: process 0 prepares while the others wait; a process that still
    finds nothing (its data_dir is not the one process 0 wrote) prepares its own copy."""
    find = functools.partial(shards.find, config, tokenizer.fingerprint, process_count)
    prepare = functools.partial(
        prepare_blocks, config, tokenizer.serialized(), shard_count(process_count), download=False
    )
    found = find()
    error = None
    if found is None and process_index == 0:
        logging.info("Preparing %s once (tokenize and pack into shards)", config.dataset)
        try:
            prepare()
        except ConfigError as e:
            error = e
    multihost.raise_together(error, "preparing the corpus")
    found = found or find()
    if found is None:
        prepare()
        found = find()
    return found


def _shard_blocks(config, tokenizer, process_index: int, process_count: int, rows: int):
    """(train blocks, their non-pad tokens, eval blocks) of this process's shards: mapped,
    not read, so memory and startup stay flat however large the corpus."""
    directory, manifest = _shards(config, tokenizer, process_index, process_count)
    if process_index == 0:
        logging.info("Reading the prepared corpus %s", directory)
    train, tokens = shards.open_share(
        directory, manifest, "train", process_index, process_count, config
    )
    evals, _ = shards.open_share(directory, manifest, "eval", process_index, process_count, config)
    if len(evals) < rows and process_index == 0:
        logging.warning(
            "The prepared eval split gives process 0 %d blocks for %d eval rows; the rest "
            "are padding (no weight)",
            len(evals),
            rows,
        )
    return train, tokens, np.asarray(evals[np.arange(min(rows, len(evals)))], np.int32)


def create_datasets(
    config: DataConfig, tokenizer: Tokenizer, process_index: int, process_count: int
) -> Datasets:
    """This process's train and eval batches from its shards of the corpus packed with
    `tokenizer`, prepared first if they are not yet. Collective: every process calls it (it
    may prepare the corpus)."""
    batch_size = local_batch_size(config, process_count)
    if not config.eval_split and config.eval_batches > 0 and config.eval_holdout_fraction <= 0:
        raise ConfigError(
            f"eval_holdout_fraction={config.eval_holdout_fraction} with eval_split='' leaves "
            "no eval documents; set a fraction in (0, 1), an eval_split, or eval_batches=0"
        )
    rows = config.eval_batches * batch_size
    train, train_tokens, evals = _shard_blocks(
        config, tokenizer, process_index, process_count, rows
    )
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
