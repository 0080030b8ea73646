"""Tokenize and pack once: a process's documents become int32 `seq_len` blocks, cached under
`WORKDIR/data_cache/` so that a resumed run, or a second run in the same workdir, skips the
minutes of tokenization and reads the blocks straight back."""

import hashlib
import itertools
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from maelm_jax import paths
from maelm_jax.data.documents import read_documents
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from maelm_jax.run_config import DataConfig

CACHE_DIRNAME = "data_cache"
# Bump when the packing or the cache layout changes. 2: corpus text no longer encodes to
# special ids (a literal "<mask>" was the mask id), and segment ids are derived from `</s>`,
# which must then end a document and nothing else (model/positions/segments.py).
_CACHE_FORMAT = 2
_TOKENIZE_BATCH = 512
_PACK_FLUSH_BLOCKS = 256
_LOG_EVERY_S = 30.0


def _cut(pieces: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Joins `pieces` and splits the result into (k, width) full chunks and the rest."""
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    k = len(stream) // width
    return stream[: k * width].reshape(k, width), stream[k * width :]


def pack_documents(
    token_lists: Iterable[Sequence[int]], seq_len: int, max_blocks: int | None = None
) -> np.ndarray:
    """RoBERTa's FULL-SENTENCES packing: int32 (n, seq_len) blocks of `<s>` + seq_len-1 tokens.

    The documents, each followed by `</s>`, form one stream that is cut into chunks of
    seq_len - 1 regardless of document boundaries; only the last block is padded with `<pad>`.
    Nothing is wasted on padding, and the model still keeps documents apart: `</s>` marks
    every document's end, so the step derives each token's document
    (model/positions/segments.py) and attention stays inside it, as in fairseq's one-document
    complete_doc blocks.
    With `max_blocks`, reading stops once that many blocks are full (eval needs a few).
    """
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} must be >= 2")
    width = seq_len - 1
    eos = np.array([EOS_ID], np.int32)
    chunks: list[np.ndarray] = []  # (k, width) full chunks, in stream order
    num_chunks = 0
    rest: list[np.ndarray] = []  # the stream after the last full chunk
    rest_len = 0
    for tokens in token_lists:
        rest += [np.asarray(tokens, np.int32), eos]
        rest_len += len(tokens) + 1
        if rest_len >= _PACK_FLUSH_BLOCKS * width:  # join in bulk: one concatenate per flush
            full, tail = _cut(rest, width)
            chunks.append(full)
            num_chunks += len(full)
            rest, rest_len = [tail], len(tail)
            if max_blocks is not None and num_chunks >= max_blocks:
                break
    full, tail = _cut(rest, width)
    chunks.append(full)
    if len(tail):
        chunks.append(np.concatenate([tail, np.full(width - len(tail), PAD_ID, np.int32)])[None])
    blocks = np.concatenate(chunks)[:max_blocks]
    return np.concatenate([np.full((len(blocks), 1), BOS_ID, np.int32), blocks], axis=1)


def _tokenize(documents: Iterable[str], tokenizer: Tokenizer, log: bool) -> Iterator[list[int]]:
    """Token lists of `documents`, encoded in batches on all cores; logs docs/s if `log`."""
    start = last_log = time.perf_counter()
    count = 0
    docs = iter(documents)
    while batch := list(itertools.islice(docs, _TOKENIZE_BATCH)):
        yield from tokenizer.encode_batch(batch)
        count += len(batch)
        now = time.perf_counter()
        if log and now - last_log >= _LOG_EVERY_S:
            last_log = now
            logging.info("Tokenized %d documents (%.0f docs/s)", count, count / (now - start))
    if log:
        elapsed = max(time.perf_counter() - start, 1e-9)
        logging.info(
            "Tokenized %d documents in %.1fs (%.0f docs/s)", count, elapsed, count / elapsed
        )


def _cache_path(workdir: epath.Path, key: dict[str, Any]) -> epath.Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", key["dataset"])[:48]
    part = f"{key['process_index']}of{key['process_count']}"
    return workdir / CACHE_DIRNAME / f"{name}-{key['split_kind']}-{part}-{digest}.npy"


def _load_blocks(path: epath.Path) -> np.ndarray:
    """Memory-maps a local cache (blocks are read a batch at a time); reads a remote one."""
    if "://" not in os.fspath(path):
        return np.load(os.fspath(path), mmap_mode="r")
    with path.open("rb") as f:
        return np.load(f)


def _save_blocks(path: epath.Path, blocks: np.ndarray) -> None:
    """A temporary sibling renamed into place: a crash never leaves a truncated cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    with tmp.open("wb") as f:
        np.save(f, blocks)
    tmp.replace(path)


def _cache_key(
    config: DataConfig,
    tokenizer: Tokenizer,
    split_kind: str,
    process_index: int,
    process_count: int,
    max_blocks: int | None,
) -> dict[str, Any]:
    return {
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


def is_cached(
    config: DataConfig,
    workdir: str | os.PathLike,
    tokenizer: Tokenizer,
    process_index: int,
    process_count: int,
) -> bool:
    """Whether this workdir already trains on its own cached train blocks (a run that began
    before a prepared corpus existed keeps them, so its resume replays the same batches)."""
    key = _cache_key(config, tokenizer, "train", process_index, process_count, None)
    return _cache_path(paths.path(workdir), key).exists()


def packed_blocks(
    config: DataConfig,
    workdir: str | os.PathLike,
    tokenizer: Tokenizer,
    split_kind: str,
    process_index: int,
    process_count: int,
    max_blocks: int | None = None,
) -> np.ndarray:
    """This process's int32 (n, seq_len) blocks of a split, from the cache or built once.

    The cache is keyed by everything that changes the blocks except the source's content:
    a workdir trusts its corpus not to change under it.
    """
    key = _cache_key(config, tokenizer, split_kind, process_index, process_count, max_blocks)
    path = _cache_path(paths.path(workdir), key)
    if path.exists():
        return _load_blocks(path)
    documents = read_documents(config, split_kind, process_index, process_count)
    tokens = _tokenize(documents, tokenizer, log=process_index == 0)
    blocks = pack_documents(tokens, config.seq_len, max_blocks)
    _save_blocks(path, blocks)
    if process_index == 0:
        logging.info("Cached %d %s blocks at %s", len(blocks), split_kind, path)
    return blocks
