"""GLUE's examples, from GLUE's own download (`<glue_dir>/<TASK>/<split>.tsv`) or from TFDS.

GLUE's files are tab-separated with no quoting: a `"` is literal text, and RTE and STS-B have
sentences with an unbalanced one, so a csv reader with quoting on merges rows (Python's csv
defaults read STS-B's train.tsv as 5,712 rows, not 5,749). Each line is split on tabs alone.
Columns are found by their header names, since a task's files differ in width (MNLI's dev
files carry five annotator labels that train lacks); CoLA has no header. Label ids follow
GLUE's and TFDS's order (`task.labels[i]` is id i), so a model fine-tuned on either source
predicts the same ids.
"""

import dataclasses
import os
import pathlib
import socket
import urllib.parse
import urllib.request

from maelm_jax.config.run_config import ConfigError
from maelm_jax.glue.tasks import Task

# CoLA's files have no header; these are its four columns (the third, a grammaticality mark
# such as "*", is empty for acceptable sentences).
COLA_COLUMNS = ("source", "label", "mark", "sentence")

# TFDS glue/<task> names its text features after neither GLUE's headers nor one scheme.
TFDS_FEATURES: dict[str, tuple[str, ...]] = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "stsb": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "mnli": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
}

MAX_SCORE = 5.0  # STS-B's similarity scores run from 0 to 5

# Where TFDS's glue builder downloads from when its config names no URL (MRPC's files).
GLUE_DOWNLOAD_URL = "https://dl.fbaipublicfiles.com/glue/data/"
# How long an unprepared TFDS GLUE task waits for its download host to take a connection.
# Offline, TFDS itself retries the download 10 times with backoff: 3.5 minutes per task.
REACH_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Example:
    text_a: str
    text_b: str | None
    label: int | float  # an index into task.labels, or STS-B's score


class GlueDataError(ConfigError):
    """GLUE data that cannot be used as it is; the one-line message names the file, line and
    value, and what is allowed."""


def read(
    task: Task,
    split: str,
    glue_dir: str | os.PathLike | None = None,
    tfds_data_dir: str | None = None,
) -> list[Example]:
    """GLUE's own files where a folder is given, since they need no TFDS download; else TFDS."""
    if glue_dir is not None:
        return read_glue_file(task, glue_dir, split)
    return read_tfds(task, split, data_dir=tfds_data_dir)


def read_glue_file(task: Task, glue_dir: str | os.PathLike, split: str) -> list[Example]:
    _check_split(task, split)
    root = pathlib.Path(glue_dir).expanduser()
    if not root.is_dir():
        raise GlueDataError(
            f"GLUE folder {str(root)!r} does not exist or is not a folder; it should hold "
            f"GLUE's download, here {_files_needed(task)}"
        )
    path = root / task.glue_dir / f"{split}.tsv"
    if not path.is_file():
        raise GlueDataError(
            f"{path}: no such file; GLUE task {task.glue_dir} needs {_files_needed(task)} "
            f"under {root}"
        )
    lines = _lines(path)
    if task.header:
        if not lines:
            raise GlueDataError(f"{path}: the file is empty; it should start with a header")
        header, lines = lines[0][1], lines[1:]
    else:
        header = list(COLA_COLUMNS)
    columns = [_column(path, header, name) for name in (*task.text_columns, task.label_column)]
    examples = []
    for number, fields in lines:
        if len(fields) != len(header):
            what = "the header's" if task.header else f"{task.glue_dir}'s"
            raise GlueDataError(
                f"{path}: line {number} has {len(fields)} tab-separated fields, not {what} "
                f"{len(header)} ({', '.join(header)}); GLUE's files have no quoting, so a tab "
                "inside a sentence splits it"
            )
        texts = [fields[i] for i in columns[:-1]]
        label = _label(task, fields[columns[-1]], f"{path}: line {number}")
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise GlueDataError(f"{path}: holds no examples, only blank lines or a header")
    return examples


def from_tfds(task: Task, features: dict) -> Example:
    """One example of TFDS's glue/<task>, as `tfds.as_numpy` gives it (text as bytes)."""
    names = TFDS_FEATURES[task.name]
    missing = [n for n in (*names, "label") if n not in features]
    if missing:
        raise GlueDataError(
            f"TFDS glue/{task.name}: an example lacks feature(s) {', '.join(missing)}; "
            f"it has {', '.join(map(str, features))}"
        )
    texts = [_text(features[n]) for n in names]
    raw = features["label"]
    where = f"TFDS glue/{task.name}"
    if task.is_regression:
        label = _score(float(raw), repr(float(raw)), where)
    else:
        label = int(raw)
        if label == -1:
            raise GlueDataError(
                f"{where}: an example has label -1, TFDS's mark of an unlabeled test row; "
                "read the train or validation splits"
            )
        if not 0 <= label < task.num_labels:
            raise GlueDataError(
                f"{where}: label id {label} is outside 0..{task.num_labels - 1} "
                f"({', '.join(task.labels)})"
            )
    return Example(texts[0], texts[1] if len(texts) > 1 else None, label)


def read_tfds(task: Task, split: str, data_dir: str | None = None) -> list[Example]:
    _check_split(task, split)
    import tensorflow_datasets as tfds  # slow to import; a run on GLUE's files never needs it

    name = f"glue/{task.name}"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        if not builder.is_prepared():  # a prepared task loads offline
            check_reachable(getattr(builder.builder_config, "data_url", "") or GLUE_DOWNLOAD_URL)
        ds = tfds.load(name, split=task.tfds_split(split), data_dir=data_dir)
    except Exception as e:  # offline, not prepared, a bad data_dir: all say the same to a user
        raise GlueDataError(
            f"TFDS {name} ({task.tfds_split(split)}) could not be loaded "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); give GLUE's "
            f"own files with --glue_dir (needs {_files_needed(task)})"
        ) from None
    return [from_tfds(task, ex) for ex in tfds.as_numpy(ds)]


def check_reachable(url: str) -> None:
    """Raises OSError unless `url`'s host, or the proxy that TFDS's `requests` would take to
    it (HTTPS_PROXY and the like), accepts a TCP connection within REACH_TIMEOUT_S."""
    parts = urllib.parse.urlsplit(url)
    what, host, port = "download host", parts.hostname, parts.port or 443
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        what, host, port = "proxy", proxy_parts.hostname, proxy_parts.port or 80
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise OSError(f"the {what} {host}:{port} cannot be reached: {e}") from None


def _check_split(task: Task, split: str) -> None:
    allowed = ("train", *task.dev_splits)
    if split not in allowed:
        raise GlueDataError(
            f"GLUE task {task.glue_dir}: unknown split {split!r}; allowed: {', '.join(allowed)}"
        )


def _files_needed(task: Task) -> str:
    names = [f"{task.glue_dir}/{s}.tsv" for s in ("train", *task.dev_splits)]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _lines(path: pathlib.Path) -> list[tuple[int, list[str]]]:
    """(1-based line number, fields) of each non-empty line.

    Split on b"\\n" alone, not Python's universal newlines, so a stray "\\r" or U+2028 inside
    a sentence does not end its row. A UTF-8 BOM is dropped (GLUE's MRPC files copy the one
    of Microsoft's source file into their header).
    """
    out = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise GlueDataError(
                    f"{path}: line {number} is not UTF-8 ({e.reason}: byte "
                    f"0x{raw[e.start]:02x} at column {e.start + 1}); GLUE's files are UTF-8"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.rstrip("\r\n")
            if line:
                out.append((number, line.split("\t")))
    return out


def _column(path: pathlib.Path, header: list[str], name: str) -> int:
    if name not in header:
        raise GlueDataError(
            f"{path}: the header has no column {name!r}; found: {', '.join(header)}"
        )
    return header.index(name)


def _label(task: Task, value: str, where: str) -> int | float:
    if task.is_regression:
        try:
            score = float(value)
        except ValueError:
            raise GlueDataError(
                f"{where}: score {value!r} is not a number; {task.glue_dir}'s scores run "
                f"from 0 to {MAX_SCORE:g}"
            ) from None
        return _score(score, repr(value), where)
    if value not in task.labels:
        raise GlueDataError(
            f"{where}: label {value!r} is not one of {task.glue_dir}'s labels; allowed: "
            f"{', '.join(task.labels)}"
        )
    return task.labels.index(value)


def _score(score: float, shown: str, where: str) -> float:
    if not 0.0 <= score <= MAX_SCORE:  # also false for NaN
        raise GlueDataError(f"{where}: score {shown} is outside STS-B's range, 0 to {MAX_SCORE:g}")
    return score


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
