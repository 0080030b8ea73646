"""The documents a process reads: its share of the corpus, with eval held out.

Sources, by `DataConfig.dataset` (the run's `RunConfig.data`):

* a TFDS name ("wikipedia/20230601.en"): read from `config.data_dir`, already prepared;
* "text:<glob>": local or gs:// text files, documents separated by blank lines, none longer
  than MAX_DOCUMENT_CHARS; each process reads only its files (see `_text_documents`);
* "python_docs": the embedded corpus (`maelm_jax.default_corpus`), built on first use
  (`preparation.prepare_source`).

Each process reads a disjoint share, so no document is tokenized or trained on twice. Eval
documents come from `config.eval_split`, or, when that is "", from a held-out
`eval_holdout_fraction` of the training documents chosen by a hash of their text, so the same
text is never in both. `config.max_documents > 0` caps the documents read from the source
split before that partition.
"""

import glob
import hashlib
import itertools
import os
from collections.abc import Iterator

import tensorflow_datasets as tfds

from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError, DataConfig
from maelm_jax.data import default_corpus

TEXT_PREFIX = "text:"
SPLIT_KINDS = ("train", "eval")
TEXT_FILES_NEEDED = "give UTF-8 text files with documents separated by blank lines"
# The longest document a text file may hold: past any real one (a long novel is about 3 MB,
# the whole King James Bible 4.3 MB), short of a file that is one document only because it
# has no blank lines (one document per line, say), which would train on a single document
# and tokenize it as one string. Counted in characters as the lines are read.
MAX_DOCUMENT_CHARS = 8 * 2**20


def _held_out(text: str, fraction: float) -> bool:
    """Stable across processes, runs and machines: the text's hash, read as a number in [0, 1)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2.0**64


def _share_of_cap(max_documents: int, process_index: int, process_count: int) -> int | None:
    """This process's part of `max_documents` (None: no cap); the parts sum to the cap."""
    if max_documents <= 0:
        return None
    return max_documents // process_count + (process_index < max_documents % process_count)


def _text_documents(pattern: str, process_index: int, process_count: int) -> Iterator[str]:
    """This process's documents of the files matching `pattern` (sorted).

    With at least as many files as processes, each process reads only its files (file i goes
    to process i % process_count), so no host scans the others' text. With fewer files than
    processes, every process scans every file and keeps every process_count-th document
    (round-robin): all processes still get documents, at the price of each reading it all.
    """
    files = _glob(pattern)
    if len(files) >= process_count:
        files, keep = files[process_index::process_count], None
    else:
        keep = process_index
    index = 0
    for path in files:
        lines: list[str] = []
        size = 0
        for number, line in enumerate(itertools.chain(_utf8_lines(path), [""]), 1):
            if line.strip():  # "" above ends the last document
                size += len(line)
                if size > MAX_DOCUMENT_CHARS:
                    raise ConfigError(_too_long(path, number - len(lines), number))
                lines.append(line.rstrip("\r\n"))
                continue
            if lines:
                if keep is None or index % process_count == keep:
                    yield "\n".join(lines).strip()
                index += 1
                lines, size = [], 0
    if index == 0:
        which = f"its {len(files)} file(s)"
        if keep is None and process_count > 1:
            which = f"the {len(files)} of its files that process {process_index} reads"
        raise ConfigError(
            f"dataset={TEXT_PREFIX + pattern!r}: {which} hold only whitespace or nothing; "
            f"{TEXT_FILES_NEEDED}"
        )


def _too_long(path: str, first: int, number: int) -> str:
    limit = f"{MAX_DOCUMENT_CHARS:,} characters, the most a document may hold"
    where = f"line {first} alone is longer than {limit}"
    if number > first:
        where = f"the document that starts at line {first} passes {limit}, at line {number}"
    return (
        f"{path}: {where}; a document ends at a blank line, so a file without blank lines is "
        f"one document: {TEXT_FILES_NEEDED}"
    )


def _utf8_lines(path: str) -> Iterator[str]:
    """The lines of text file `path`, which must be UTF-8 (a UTF-8 BOM is dropped).

    Policy: bytes that are not UTF-8 are an error naming the file, line and byte, never
    silently replaced, since a file in another encoding would train the tokenizer on
    mojibake. Convert such files first (`iconv -f LATIN1 -t UTF-8`).
    """
    opened, errors = _opener(path)
    try:
        with opened(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(
                        f"{path}: line {number} is not UTF-8 ({e.reason}: byte "
                        f"0x{raw[e.start]:02x} at column {e.start + 1}); text files must be "
                        "UTF-8: convert it first, e.g. `iconv -f LATIN1 -t UTF-8`"
                    ) from None
                yield line.removeprefix("\ufeff") if number == 1 else line
    except errors as e:
        raise ConfigError(f"cannot read data file {path}: {getattr(e, 'message', e)}") from None


def _opener(path: str):
    """(open, the errors it raises) for `path`: Python's for a local file, gfile's for a URL."""
    if "://" not in path:
        return open, OSError
    tf = _tensorflow()
    return tf.io.gfile.GFile, tf.errors.OpError


def _tensorflow():
    """TensorFlow, for gs:// URLs (gfile) alone: it takes ~6 s to import, a run on local text
    files never needs it, and nor do the commands that only import this module."""
    import tensorflow as tf

    return tf


def _glob(pattern: str) -> list[str]:
    if "://" in pattern:
        files = _tensorflow().io.gfile.glob(pattern)
    else:
        matches = glob.glob(os.path.expanduser(pattern), recursive=True)
        files = [f for f in matches if os.path.isfile(f)]
    if not files:
        raise ConfigError(
            f"dataset={TEXT_PREFIX + pattern!r}: the glob {pattern!r} matches no file; "
            f"{TEXT_FILES_NEEDED}"
        )
    return sorted(files)


def refuse_study_corpus(name: str) -> None:
    """A study config's corpus is text only the study writes (studies/task_text.py); a
    config that names it may still be compiled or counted, but not trained outside it."""
    if name == STUDY_TASK_TEXT:
        raise ConfigError(
            f"dataset={name!r} is a study's own corpus, which `python -m maelm_jax.study` "
            f"writes; run the config through the study, or set dataset to a TFDS name, "
            f"'{TEXT_PREFIX}<glob>' or '{default_corpus.NAME}'"
        )


def _tfds_builder(config: DataConfig) -> tfds.core.DatasetBuilder:
    """The dataset's builder, prepared; for `python_docs` preparing it first if needed."""
    name = config.dataset
    refuse_study_corpus(name)
    if name == default_corpus.NAME:
        return default_corpus.builder(config.data_dir)
    try:
        builder = tfds.builder(name, data_dir=config.data_dir)
    except (tfds.core.registered.DatasetNotFoundError, ValueError, AssertionError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"dataset={name!r} is not a TFDS dataset ({reason}); list the names with "
            "`python -c 'import tensorflow_datasets as tfds; print(tfds.list_builders())'`, "
            f"or use '{TEXT_PREFIX}<glob>' or '{default_corpus.NAME}'"
        ) from None
    if not builder.is_prepared():
        raise ConfigError(
            f"dataset={name!r} is not prepared in data_dir={builder.data_dir_root!r}; "
            f"prepare it once with `tfds build {name} --data_dir=...` and set data_dir"
        )
    return builder


def _text_feature(builder: tfds.core.DatasetBuilder) -> str:
    """'text', else 'content', else the only Text feature; anything else is ambiguous."""
    features = builder.info.features
    for key in ("text", "content"):
        if key in features:
            return key
    texts = [k for k, f in features.items() if isinstance(f, tfds.features.Text)]
    if len(texts) != 1:
        raise ConfigError(
            f"dataset={builder.name!r} has no 'text' or 'content' feature and no single Text "
            f"feature to use instead; its features are {sorted(features)}"
        )
    return texts[0]


def _tfds_documents(
    config: DataConfig, split_key: str, process_index: int, process_count: int
) -> Iterator[str]:
    """This process's contiguous `tfds.even_splits` part of the split, in file order."""
    builder = _tfds_builder(config)
    split = getattr(config, split_key)
    if any(part.split("[")[0].strip() not in builder.info.splits for part in split.split("+")):
        raise ConfigError(
            f"{split_key}={split!r} is not a split of dataset={config.dataset!r}; "
            f"it has {sorted(builder.info.splits)}"
        )
    key = _text_feature(builder)
    shard = tfds.even_splits(split, n=process_count)[process_index]
    ds = builder.as_dataset(split=shard, shuffle_files=False)
    for text in ds.map(lambda ex: ex[key]).as_numpy_iterator():
        yield text.decode("utf-8")


def _source_documents(
    config: DataConfig, split_key: str, process_index: int, process_count: int
) -> Iterator[str]:
    if config.dataset.startswith(TEXT_PREFIX):
        if getattr(config, split_key) != "train":
            raise ConfigError(
                f"{split_key}={getattr(config, split_key)!r} is not allowed for dataset="
                f"{config.dataset!r}: text files have one split, 'train' (leave eval_split "
                "empty to hold out eval_holdout_fraction of it)"
            )
        docs = _text_documents(config.dataset[len(TEXT_PREFIX) :], process_index, process_count)
    else:
        docs = _tfds_documents(config, split_key, process_index, process_count)
    docs = (d for d in docs if d.strip())
    return itertools.islice(docs, _share_of_cap(config.max_documents, process_index, process_count))


def _started(docs: Iterator[str]) -> Iterator[str] | None:
    """`docs` unchanged, but with its first item drawn now, so that a lazy source's checks
    raise here rather than at the caller's first `next`; None when there is no first item."""
    first = next(docs, None)
    return None if first is None else itertools.chain([first], docs)


def read_documents(
    config: DataConfig, split_kind: str, process_index: int, process_count: int
) -> Iterator[str]:
    """This process's documents of the 'train' or 'eval' split, in a fixed order.

    Shares of different processes are disjoint and together cover the split. Raises
    ConfigError now (not at the first `next`) for an unknown dataset, split or glob.
    """
    if split_kind not in SPLIT_KINDS:
        raise ValueError(f"split_kind={split_kind!r}; use one of {SPLIT_KINDS}")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    fraction = config.eval_holdout_fraction
    if not config.eval_split and not 0.0 <= fraction < 1.0:
        raise ConfigError(f"eval_holdout_fraction={fraction} must lie in [0, 1)")
    if split_kind == "eval" and config.eval_split:
        docs = _source_documents(config, "eval_split", process_index, process_count)
    else:
        docs = _source_documents(config, "train_split", process_index, process_count)
        if not config.eval_split:
            want_eval = split_kind == "eval"
            docs = (d for d in docs if _held_out(d, fraction) == want_eval)
    return _started(docs) or iter(())


def source_bytes(config: DataConfig) -> int | None:
    """The size of the source, to size the packing job: the text files' bytes, or the TFDS
    dataset's as its metadata gives it; None when unknown (a TFDS name not prepared yet)."""
    if config.dataset.startswith(TEXT_PREFIX):
        return sum(_size(f) for f in _glob(config.dataset[len(TEXT_PREFIX) :]))
    try:
        builder = tfds.builder(config.dataset, data_dir=config.data_dir)
    except (tfds.core.registered.DatasetNotFoundError, ValueError, AssertionError):
        # not a TFDS name: `read_documents` says so
        return None
    return int(builder.info.dataset_size) if builder.is_prepared() else None


def _size(path: str) -> int:
    if "://" not in path:
        return os.path.getsize(path)
    return _tensorflow().io.gfile.stat(path).length
