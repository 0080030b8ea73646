"""Where `python -m maelm_jax.prepare_data` puts its results, and how it builds them once.

Layout, next to the TFDS data (`data_dir`, or TFDS's default):

    DATA_DIR/maelm_jax_prepared/<dataset>-<digest>/
        tokenizer.model     the SentencePiece model trained on the corpus sample
        statistics.json     corpus statistics of the training documents
        blocks-seq<L>-shards<N>/    the corpus tokenized and packed (`shards` has the format)
            manifest.json           written last: marks the blocks "done"
            .claims/
        blocks-seq<L>-shards<N>-vocab<sha>/  the same with another tokenizer (`vocab_path`)
        .claims/            who is building (see `build_once`)

The digest covers every setting that changes the tokenizer or the statistics, so two
configs that read the same documents with the same vocabulary share one directory.
"""

import hashlib
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable

from absl import logging
from etils import epath

from maelm_jax.config import paths
from maelm_jax.config.run_config import DataConfig

DIRNAME = "maelm_jax_prepared"
TOKENIZER_FILENAME = "tokenizer.model"
STATISTICS_FILENAME = "statistics.json"
CLAIMS_DIRNAME = ".claims"
_FORMAT = 1  # bump when the tokenizer training or the statistics change
_DEFAULT_TFDS_DIR = os.path.join("~", "tensorflow_datasets")


def data_root(config: DataConfig) -> epath.Path:
    """`config.data_dir`, or TFDS's default (TFDS_DATA_DIR, else ~/tensorflow_datasets)."""
    if config.data_dir:
        return paths.path(config.data_dir)
    return epath.Path(os.path.expanduser(os.environ.get("TFDS_DATA_DIR", _DEFAULT_TFDS_DIR)))


def directory(config: DataConfig) -> epath.Path:
    key = {
        "format": _FORMAT,
        "dataset": config.dataset,
        "train_split": config.train_split,
        "eval_split": config.eval_split,
        "eval_holdout_fraction": config.eval_holdout_fraction,
        "max_documents": config.max_documents,
        "vocab_size": config.vocab_size,
        "tokenizer_train_documents": config.tokenizer_train_documents,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", config.dataset).strip("_")[:48]
    return data_root(config) / DIRNAME / f"{name}-{digest}"


def tokenizer_path(config: DataConfig) -> epath.Path:
    return directory(config) / TOKENIZER_FILENAME


def statistics_path(config: DataConfig) -> epath.Path:
    return directory(config) / STATISTICS_FILENAME


def blocks_directory(
    config: DataConfig, num_shards: int, other_tokenizer: str | None = None
) -> epath.Path:
    """Where `num_shards` shards of `config.seq_len` blocks live (seq_len is not in the
    digest: one tokenizer serves every block length). Blocks of the corpus's own tokenizer
    have the plain name; those of another one (`vocab_path`, or a workdir's model from an
    older version) are named by its sha256, `other_tokenizer`."""
    name = f"blocks-seq{config.seq_len}-shards{num_shards}"
    if other_tokenizer:
        name += f"-vocab{other_tokenizer[:12]}"
    return directory(config) / name


def write_atomically(path: epath.Path, data: bytes) -> None:
    """A temporary sibling renamed into place: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    tmp.write_bytes(data)
    tmp.replace(path)


def build_once(
    done: epath.Path, build: Callable[[], None], poll_s: float = 1.0, timeout_s: float = 86400
) -> bool:
    """Runs `build` (which must write `done` last, atomically) unless `done` exists; True
    when this call built.

    Any number of processes, on any hosts sharing the storage, may call it at once: each
    writes a claim file named by its start time into `.claims/` and lists the claims; the
    oldest claim builds, the others wait until `done` appears. A builder that fails removes
    its claim and the next oldest takes over. Plain files and listing only, so it works on
    gs:// as on a local disk (hosts' clocks must agree to within the time a claim takes to
    write). A claim left by a killed process of this host is removed when found (its pid is
    gone), so an interrupted build is taken over; one from another host is named in the log
    for the user to delete.
    """
    claims = done.parent / CLAIMS_DIRNAME
    deadline = time.monotonic() + timeout_s
    while not done.exists():
        claims.mkdir(parents=True, exist_ok=True)
        mine = claims / f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        mine.write_text(f"host={socket.gethostname()} pid={os.getpid()}\n")
        try:
            first = min(c.name for c in claims.iterdir())
            if first == mine.name:
                if done.exists():  # finished between our check and our claim
                    return False
                build()
                return True
            try:
                holder = (claims / first).read_text().strip()
            except FileNotFoundError:  # it just finished or gave up: look again
                continue
            if _dead_here(holder):
                (claims / first).unlink(missing_ok=True)
                logging.info("Removed the claim of %s, which no longer runs", holder)
                continue
            logging.info(
                "Waiting for %s to finish preparing %s (if that process is gone, delete %s)",
                holder,
                done.parent,
                claims / first,
            )
            while not done.exists() and (claims / first).exists():
                if _dead_here(holder):  # killed while we waited: the next oldest builds
                    (claims / first).unlink(missing_ok=True)
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{claims / first} still held after {timeout_s:.0f}s")
                time.sleep(poll_s)
        finally:
            mine.unlink(missing_ok=True)
    return False


def _dead_here(holder: str) -> bool:
    """Whether a claim's "host=H pid=P" names a process of this host that has ended."""
    fields = dict(f.split("=", 1) for f in holder.split() if "=" in f)
    if fields.get("host") != socket.gethostname() or not fields.get("pid", "").isdigit():
        return False
    try:
        os.kill(int(fields["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False
