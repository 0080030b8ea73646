"""The blocks that versions before 2026-11-26 packed per workdir, read back for their resume.

Those versions tokenized each process's share into `WORKDIR/data_cache/` and trained on it.
Nothing writes that cache any more (a new run prepares its corpus once, `preparation`); a
workdir that holds one keeps reading it, so its resume replays exactly the batches it began
with (`legacy_blocks`)."""

import hashlib
import json
import os
import re
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from maelm_jax.config import paths
from maelm_jax.config.run_config import DataConfig
from maelm_jax.data.documents import read_documents
from maelm_jax.data.shard_writer import pack_documents
from maelm_jax.data.tokenizer import Tokenizer

CACHE_DIRNAME = "data_cache"
# The format of the last version that wrote the cache, part of its file names: frozen. (2:
# corpus text no longer encoded to special ids, and segment ids came from `</s>`.)
_CACHE_FORMAT = 2


def _cache_path(workdir: epath.Path, key: dict[str, Any]) -> epath.Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", key["dataset"])[:48]
    part = f"{key['process_index']}of{key['process_count']}"
    return workdir / CACHE_DIRNAME / f"{name}-{key['split_kind']}-{part}-{digest}.npy"


def cache_path(
    config: DataConfig,
    workdir: str | os.PathLike,
    tokenizer: Tokenizer,
    split_kind: str,
    process_index: int,
    process_count: int,
    max_blocks: int | None = None,
) -> epath.Path:
    """Where the old versions cached a process's blocks of a split: keyed by everything that
    changed them (a workdir trusted its corpus not to change under it)."""
    key = {
        "format": _CACHE_FORMAT,
        "dataset": config.dataset,
        "split_kind": split_kind,
        "train_split": config.train_split,
        "eval_split": config.eval_split,
        "eval_holdout_fraction": config.eval_holdout_fraction,
        "max_documents": config.max_documents,
        "tokenizer": tokenizer.fingerprint,
        "seq_len": config.seq_len,
        "process_index": process_index,
        "process_count": process_count,
        "max_blocks": max_blocks,
    }
    return _cache_path(paths.path(workdir), key)


def _load_blocks(path: epath.Path) -> np.ndarray:
    """Memory-maps a local cache (blocks are read a batch at a time); reads a remote one."""
    if "://" not in os.fspath(path):
        return np.load(os.fspath(path), mmap_mode="r")
    with path.open("rb") as f:
        return np.load(f)


def legacy_blocks(
    config: DataConfig,
    workdir: str | os.PathLike,
    tokenizer: Tokenizer,
    process_index: int,
    process_count: int,
    eval_rows: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(train, eval blocks) of this process's old per-workdir cache, or None when the workdir
    has none (every run since prepares its corpus instead).

    The eval blocks are the cached ones; if the cache lacks them for `eval_rows` (the eval
    size changed on resume), they are packed from the eval documents here, as the old
    version did, without writing anything.
    """
    train_path = cache_path(config, workdir, tokenizer, "train", process_index, process_count)
    if not train_path.exists():
        return None
    train = _load_blocks(train_path)
    if process_index == 0:
        logging.info("Resuming on the blocks this workdir cached before (%s)", train_path)
    if not eval_rows or not len(train):
        return train, np.zeros((0, config.seq_len), np.int32)
    eval_path = cache_path(
        config, workdir, tokenizer, "eval", process_index, process_count, eval_rows
    )
    if eval_path.exists():
        return train, _load_blocks(eval_path)
    docs = list(read_documents(config, "eval", process_index, process_count))
    return train, pack_documents(tokenizer.encode_batch(docs), config.seq_len, eval_rows)
