"""The tokenize-and-pack stage of a corpus's preparation: a multiprocessing job over shards
on one machine, writing the format `shards` describes.

Shard i of N holds the blocks of `read_documents(config, split, i, N)`, the share a process i of
N would read (text files i, i+N, ... when there are at least N; a contiguous `tfds.even_splits`
part of a TFDS split), packed by `pack_documents` (`</s>` ends every document, so the model
derives its segment ids from the blocks). A shard is a pure function of (config, tokenizer, i,
N), so the output is byte-identical whatever the number of workers, and a shard already written
(its `.json` beside it) is kept: an interrupted prepare resumes where it stopped. Workers are
spawned, not forked (TensorFlow's threads do not survive a fork), and each encodes on one
thread.

Why not Beam: the job is embarrassingly parallel over shards and one machine's cores prepare
about 1 MB of text per second per core (`bench input`), so 160 GB is a day on a 96-core VM;
a Beam pipeline would map the same `build_shard` over shard indices (not built).
"""

import concurrent.futures
import itertools
import json
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging
from etils import epath

from maelm_jax.config.run_config import DataConfig
from maelm_jax.data import prepared, shards
from maelm_jax.data.documents import read_documents
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, FIRST_REGULAR_ID, PAD_ID, Tokenizer

_ENCODE_BATCH = 512
_PACK_FLUSH_BLOCKS = 256
# Eval blocks kept in all: more than the base configs read (20 batches of 8192 rows), a
# small part of a large corpus's held-out documents.
MAX_EVAL_BLOCKS = 1 << 18


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


def _token_lists(documents, tokenizer: Tokenizer, sizes: list[int]):
    docs = iter(documents)
    while batch := list(itertools.islice(docs, _ENCODE_BATCH)):
        sizes.append(sum(len(d.encode("utf-8")) for d in batch))
        yield from tokenizer.encode_batch(batch, num_threads=1)


def _save(path: epath.Path, blocks: np.ndarray) -> None:
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    with tmp.open("wb") as f:
        np.save(f, blocks)
    tmp.replace(path)


def build_shard(
    config: DataConfig,
    model: bytes,
    directory: str,
    split_kind: str,
    index: int,
    num_shards: int,
    max_blocks: int | None,
) -> tuple[dict, np.ndarray | None]:
    """(manifest entry, token counts by id of a train shard) for shard `index`; builds it
    unless a previous run finished it."""
    directory = epath.Path(directory)
    name = shards.shard_name(split_kind, index, num_shards)
    path, done = directory / name, directory / f"{name}.json"
    tokenizer = Tokenizer(model)
    if done.exists() and path.exists():
        entry = json.loads(done.read_text())
    else:
        sizes: list[int] = []
        docs = read_documents(config, split_kind, index, num_shards)
        blocks = pack_documents(_token_lists(docs, tokenizer, sizes), config.seq_len, max_blocks)
        blocks = blocks.astype(shards.dtype_for(tokenizer.vocab_size))
        _save(path, blocks)
        entry = {
            "file": name,
            "blocks": len(blocks),
            "tokens": int(np.count_nonzero(blocks != PAD_ID)),
            "documents": int(np.count_nonzero(blocks == EOS_ID)),
            "text_bytes": sum(sizes),
            "sha256": shards.sha256_of(path),
        }
        prepared.write_atomically(done, json.dumps(entry).encode())
    if split_kind != "train":
        return entry, None
    blocks = np.load(os.fspath(path), mmap_mode="r") if "://" not in os.fspath(path) else None
    if blocks is None:
        with path.open("rb") as f:
            blocks = np.load(f)
    return entry, np.bincount(blocks.reshape(-1), minlength=tokenizer.vocab_size)


def _statistics(counts: np.ndarray, entries: list[dict]) -> dict:
    """The corpus statistics of the training documents, from the shards' token counts."""
    counts = counts.copy()
    counts[[BOS_ID, PAD_ID, EOS_ID]] = 0
    assert not counts[:FIRST_REGULAR_ID].any(), "text encoded to a special id"
    tokens = int(counts.sum())
    p = counts[counts > 0] / max(tokens, 1)
    return {
        "documents": sum(e["documents"] for e in entries),
        "tokens": tokens,
        "distinct_tokens": int(np.count_nonzero(counts)),
        "unigram_entropy_bits": float(-(p * np.log2(p)).sum()),
    }


def build(
    config: DataConfig,
    model: bytes,
    directory: epath.Path,
    num_shards: int,
    workers: int,
    max_eval_blocks: int = MAX_EVAL_BLOCKS,
) -> None:
    """Writes every missing shard with `workers` processes, then the manifest (last)."""
    start = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    has_eval = bool(config.eval_split) or config.eval_holdout_fraction > 0
    tasks = [("train", i, None) for i in range(num_shards)]
    if has_eval:
        tasks += [("eval", i, -(-max_eval_blocks // num_shards)) for i in range(num_shards)]
    args = [(config, model, os.fspath(directory), k, i, num_shards, m) for k, i, m in tasks]
    if workers <= 1:
        results = [build_shard(*a) for a in args]
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            results = list(pool.map(build_shard, *zip(*args, strict=True)))
    seconds = time.perf_counter() - start
    tokenizer = Tokenizer(model)
    train = [
        entry for (kind, _, _), (entry, _) in zip(tasks, results, strict=True) if kind == "train"
    ]
    evals = [
        entry for (kind, _, _), (entry, _) in zip(tasks, results, strict=True) if kind == "eval"
    ]
    counts = sum(c for _, c in results if c is not None)
    text_bytes = sum(e["text_bytes"] for e in train + evals)
    manifest = {
        "format": shards.FORMAT,
        "dataset": config.dataset,
        "tokenizer_sha256": tokenizer.fingerprint,
        "vocab_size": tokenizer.vocab_size,
        "seq_len": config.seq_len,
        "dtype": shards.dtype_for(tokenizer.vocab_size).name,
        "num_shards": num_shards,
        "eval": config.eval_split or f"held out: {config.eval_holdout_fraction} of train",
        "splits": {"train": train, "eval": evals},
        "statistics": _statistics(counts, train),
        "build": {"seconds": round(seconds, 2), "workers": workers, "text_bytes": text_bytes},
    }
    logging.info(
        "Packed %d shards (%.1f MB of text) in %.1fs with %d workers",
        len(tasks),
        text_bytes / 1e6,
        seconds,
        workers,
    )
    prepared.write_atomically(
        directory / shards.MANIFEST_FILENAME, (json.dumps(manifest, indent=1) + "\n").encode()
    )


def remove_bad(directory: epath.Path, config: DataConfig) -> list[str]:
    """Before a rerun: the shards that are missing or differ from a finished manifest lose
    their `.json` (so they are rebuilt), and the manifest goes; the names, [] if all good."""
    manifest = shards.read_manifest(directory)
    if manifest is None:
        return []
    bad = []
    for entry in itertools.chain(*manifest["splits"].values()):
        try:
            shards.check_shard(directory, entry, config)
        except shards.ShardError:
            bad.append(entry["file"])
            (directory / f"{entry['file']}.json").unlink(missing_ok=True)
    if bad:
        logging.warning("Rebuilding prepared shards that are missing or changed: %s", bad)
        (directory / shards.MANIFEST_FILENAME).unlink(missing_ok=True)
    return bad
