"""Prepared shards: the on-disk format of a corpus tokenized and packed once, and how a
training host reads its part of it without holding it in memory.

Under `prepared.blocks_directory(config, N)`:

    manifest.json                       written last (atomically): the shards are complete
    train-00000-of-00016.npy ...        (blocks, seq_len) uint16 (int32 past 65,536 pieces)
    eval-00000-of-00016.npy ...         the eval split, capped at a few thousand blocks
    *.npy.json                          one per finished shard: what resume skips

Why plain `.npy` and not ArrayRecord or TFRecord: a block is a fixed-size row, so the file is
its own index. `np.load(mmap_mode="r")` maps a shard in microseconds whatever its size, and a
batch is one fancy-index copy of its rows out of the page cache: no per-record framing, no
decompression, no reader threads, no dependency, and nothing read that the batch does not
use. ArrayRecord's random access reads and decodes a record (a chunk of them when grouped) per
row; TFRecord has no random access at all. A shard on gs:// is copied to local disk once
(checked while copying) and mapped from there; hosts without a local disk large enough for
their share should stream (not built).

The manifest names the tokenizer (sha256 of its model), seq_len, dtype, and per shard its
blocks, non-pad tokens, documents and sha256. Training checks every shard it will read
against it before the first step (about a second per GB on one core, in parallel across
shards) and stops with one line naming a missing or changed shard: it never trains on a
subset of what was prepared.
"""

import concurrent.futures
import hashlib
import json
import os
import shutil
import tempfile
import uuid

import numpy as np
from absl import logging
from etils import epath

from maelm_jax.config import paths
from maelm_jax.config.run_config import ConfigError, DataConfig
from maelm_jax.data import prepared
from maelm_jax.hardware import host_cpus

MANIFEST_FILENAME = "manifest.json"
FORMAT = 1
SPLIT_KINDS = ("train", "eval")
_HASH_CHUNK = 1 << 20


class ShardError(ConfigError):
    """A prepared shard is missing or differs from its manifest entry."""


def dtype_for(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half of int32's bytes), else int32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def shard_name(split_kind: str, index: int, num_shards: int) -> str:
    return f"{split_kind}-{index:05d}-of-{num_shards:05d}.npy"


def sha256_of(path: epath.Path) -> str:
    """Read through one fixed buffer where the file allows it: hashing a share of any size
    holds 1 MiB."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        if not hasattr(f, "readinto"):  # a remote file object
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
            return digest.hexdigest()
        buffer = memoryview(bytearray(_HASH_CHUNK))
        while n := f.readinto(buffer):
            digest.update(buffer[:n])
    return digest.hexdigest()


def read_manifest(directory: epath.Path) -> dict | None:
    path = directory / MANIFEST_FILENAME
    return json.loads(path.read_text()) if path.exists() else None


def _again(config: DataConfig | None) -> str:
    dataset = f" (dataset={config.dataset!r}, seq_len={config.seq_len})" if config else ""
    return f"run `python -m maelm_jax.prepare_data` with this config again{dataset} to rebuild it"


def check_shard(directory: epath.Path, entry: dict, config: DataConfig | None = None) -> epath.Path:
    """The local path to map for a manifest entry, after checking its sha256; ShardError
    (one line: the shard, the manifest's checksum, what to do) when missing or changed."""
    path = directory / entry["file"]
    if not path.exists():
        raise ShardError(
            f"prepared shard {path} is missing (manifest sha256 {entry['sha256']}); "
            + _again(config)
        )
    local = path if "://" not in os.fspath(path) else _local_copy(path, entry["sha256"])
    actual = sha256_of(local)
    if actual != entry["sha256"]:
        raise ShardError(
            f"prepared shard {path} is corrupt: its sha256 is {actual}, the manifest's "
            f"{entry['sha256']}; " + _again(config)
        )
    return local


def _local_copy(path: epath.Path, sha256: str) -> epath.Path:
    """A remote shard copied once to this host's temp disk (keyed by its checksum)."""
    local = epath.Path(tempfile.gettempdir()) / "maelm_jax_shards" / f"{sha256[:20]}.npy"
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.parent / f".{local.name}.tmp-{uuid.uuid4().hex}"
        with path.open("rb") as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, _HASH_CHUNK)
        tmp.replace(local)
    return local


class ShardedBlocks:
    """Several memory-mapped (blocks, seq_len) shards read as one array of rows: `len`,
    `shape`, `dtype` and `blocks[rows]` for an int array of rows, which copies only those
    rows into memory. What `TrainBatches` needs, and nothing held but the maps."""

    def __init__(self, arrays: list[np.ndarray], seq_len: int):
        self.arrays = [a for a in arrays if len(a)]
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays])
        self.dtype = self.arrays[0].dtype if self.arrays else np.dtype(np.int32)
        self.shape = (int(self.starts[-1]), seq_len)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.ndim == 0 or rows.dtype.kind not in "iu":
            raise TypeError("ShardedBlocks takes an int array of rows")
        out = np.empty((len(rows), self.shape[1]), self.dtype)
        which = np.searchsorted(self.starts, rows, side="right") - 1
        for shard in np.unique(which):
            at = which == shard
            out[at] = self.arrays[shard][rows[at] - self.starts[shard]]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """Every row in memory: for tests and small corpora only."""
        whole = np.concatenate(self.arrays) if self.arrays else np.zeros(self.shape, self.dtype)
        return whole if dtype is None else whole.astype(dtype)


def find(config: DataConfig, tokenizer_sha256: str, process_count: int):
    """(directory, manifest) of the prepared blocks this run can read, or None.

    They match on the tokenizer's sha256 and seq_len (the directory already fixes the
    dataset, splits and vocabulary settings). Among shard counts, one that `process_count`
    divides is preferred (every host reads as many shards), then the fewest; None (the run
    prepares its own count) when every prepared count is smaller than the process count.
    """
    root = prepared.directory(config)
    if not root.exists():
        return None
    found = []
    for directory in root.glob(f"blocks-seq{config.seq_len}-shards*"):
        manifest = read_manifest(directory)
        if (
            manifest is not None
            and manifest["tokenizer_sha256"] == tokenizer_sha256
            and manifest["seq_len"] == config.seq_len
        ):
            found.append((manifest["num_shards"], directory, manifest))
    if not found:
        return None
    usable = [f for f in found if f[0] >= process_count]
    if not usable:
        logging.warning(
            "The prepared corpus in %s has at most %d shards, fewer than the %d processes: "
            "preparing it again in more",
            root,
            max(f[0] for f in found),
            process_count,
        )
        return None
    _, directory, manifest = min(usable, key=lambda f: (f[0] % process_count != 0, f[0]))
    return directory, manifest


def open_share(
    directory: epath.Path,
    manifest: dict,
    split_kind: str,
    process_index: int,
    process_count: int,
    config: DataConfig | None = None,
) -> tuple[ShardedBlocks, int]:
    """(blocks, non-pad tokens) of this process's shards of a split (shards i with
    i % process_count == process_index), each checked and memory-mapped."""
    entries = manifest["splits"][split_kind][process_index::process_count]
    with concurrent.futures.ThreadPoolExecutor(
        max(1, min(len(entries), host_cpus.usable_cpus()))
    ) as pool:
        local = list(pool.map(lambda e: check_shard(directory, e, config), entries))
    arrays = [np.load(os.fspath(paths.path(p)), mmap_mode="r") for p in local]
    for entry, array in zip(entries, arrays, strict=True):
        if array.shape != (entry["blocks"], manifest["seq_len"]):
            raise ShardError(
                f"prepared shard {directory / entry['file']} holds {array.shape}, the manifest "
                f"{entry['blocks']} blocks (sha256 {entry['sha256']}); " + _again(config)
            )
    return ShardedBlocks(arrays, manifest["seq_len"]), sum(e["tokens"] for e in entries)
