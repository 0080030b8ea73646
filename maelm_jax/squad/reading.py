"""SQuAD's questions, from the official files (`<squad_dir>/train-v2.0.json`, `dev-v2.0.json`,
or the v1.1 pair) or from TFDS (`squad/v2.0`, `squad/v1.1`).

The files nest `data[].paragraphs[].{context, qas[]}`; each question keeps its context, its
gold answers (text and character start) and, in 2.0, `is_impossible`. An answer whose text
does not sit at its `answer_start` is kept as given (features read the span from
`answer_start` and the text's length, as HuggingFace's `run_qa.py` does) and counted in one
log line: a handful of the official files' answers are off by whitespace.
"""

import dataclasses
import json
import os
import pathlib

from absl import logging

from maelm_jax.config.run_config import ConfigError
from maelm_jax.glue.readers import check_reachable  # the offline check GLUE's TFDS reads make first

# Where TFDS's squad builder downloads the official files from.
SQUAD_DOWNLOAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
SPLITS = ("train", "dev")


@dataclasses.dataclass(frozen=True)
class Version:
    name: str  # as on the command line: squad_v2, squad_v1
    number: str  # as in the official files' names and TFDS's configs: 2.0, 1.1
    with_null: bool  # 2.0's questions may have no answer in their context

    def file_name(self, split: str) -> str:
        return f"{split}-v{self.number}.json"

    @property
    def tfds_name(self) -> str:
        return f"squad/v{self.number}"


VERSIONS = {
    v.name: v for v in (Version("squad_v2", "2.0", True), Version("squad_v1", "1.1", False))
}


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    start: int  # the character in the context where the text begins (`answer_start`)


@dataclasses.dataclass(frozen=True)
class Example:
    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # () for a question with no answer (2.0)
    is_impossible: bool

    @property
    def has_answer(self) -> bool:
        """What the official evaluation counts as answerable: any gold answer at all."""
        return bool(self.answers)


class SquadDataError(ConfigError):
    """SQuAD data that cannot be used as it is; the one-line message names the file and what
    is wrong with it."""


def read(
    version: Version,
    split: str,
    squad_dir: str | os.PathLike | None = None,
    tfds_data_dir: str | None = None,
) -> list[Example]:
    """The official files where a folder is given, since they need no TFDS download; else TFDS."""
    if split not in SPLITS:
        raise SquadDataError(f"SQuAD: unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    if squad_dir is not None:
        return read_squad_file(squad_file(version, split, squad_dir))
    return read_tfds(version, split, data_dir=tfds_data_dir)


def squad_file(version: Version, split: str, squad_dir: str | os.PathLike) -> pathlib.Path:
    root = pathlib.Path(squad_dir).expanduser()
    needed = f"{version.file_name('train')} and {version.file_name('dev')}"
    if not root.is_dir():
        raise SquadDataError(
            f"SQuAD folder {str(root)!r} does not exist or is not a folder; it should hold "
            f"the official {needed}"
        )
    path = root / version.file_name(split)
    if not path.is_file():
        raise SquadDataError(f"{path}: no such file; SQuAD {version.number} needs {needed}")
    return path


def read_squad_file(path: str | os.PathLike) -> list[Example]:
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            document = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SquadDataError(
            f"{path}: not a JSON file ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "give SQuAD's official file"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise SquadDataError(
            f"{path}: has no `data` list; SQuAD's files hold "
            "data[].paragraphs[].{context, qas[].{id, question, answers}}"
        )
    examples = []
    for a, article in enumerate(document["data"]):
        for p, paragraph in enumerate(_field(path, article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(path, paragraph, "context", str, where)
            for q, qa in enumerate(_field(path, paragraph, "qas", list, where)):
                examples.append(_example(path, qa, context, f"{where}.qas[{q}]"))
    _check(str(path), examples)
    return examples


def read_tfds(version: Version, split: str, data_dir: str | None = None) -> list[Example]:
    import tensorflow_datasets as tfds  # slow to import; a run on the official files skips it

    tfds_split = "validation" if split == "dev" else split
    try:
        builder = tfds.builder(version.tfds_name, data_dir=data_dir)
        if not builder.is_prepared():  # a prepared dataset loads offline
            check_reachable(SQUAD_DOWNLOAD_URL)
        ds = tfds.load(version.tfds_name, split=tfds_split, data_dir=data_dir)
    except Exception as e:  # offline, not prepared, a bad data_dir: all say the same to a user
        raise SquadDataError(
            f"TFDS {version.tfds_name} ({tfds_split}) could not be loaded "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); give the "
            f"official files with --squad_dir (needs {version.file_name('train')} and "
            f"{version.file_name('dev')})"
        ) from None
    examples = [from_tfds(ex) for ex in tfds.as_numpy(ds)]
    _check(f"TFDS {version.tfds_name} ({tfds_split})", examples)
    return examples


def from_tfds(features: dict) -> Example:
    """One question of TFDS's squad/v2.0 or v1.1, as `tfds.as_numpy` gives it (bytes)."""
    answers = features["answers"]
    return Example(
        id=_text(features["id"]),
        question=_text(features["question"]),
        context=_text(features["context"]),
        answers=tuple(
            Answer(_text(t), int(s))
            for t, s in zip(answers["text"], answers["answer_start"], strict=True)
        ),
        is_impossible=bool(features.get("is_impossible", False)),
    )


def _example(path: pathlib.Path, qa, context: str, where: str) -> Example:
    answers = []
    for n, answer in enumerate(_field(path, qa, "answers", list, where)):
        at = f"{where}.answers[{n}]"
        text = _field(path, answer, "text", str, at)
        start = _field(path, answer, "answer_start", int, at)
        if not 0 <= start <= len(context):
            raise SquadDataError(
                f"{path}: {at} has answer_start {start}, outside its context's "
                f"{len(context)} characters"
            )
        answers.append(Answer(text, start))
    impossible = qa.get("is_impossible", False) if isinstance(qa, dict) else False
    if not isinstance(impossible, bool):
        raise SquadDataError(f"{path}: {where}.is_impossible is {impossible!r}, not true/false")
    return Example(
        id=_field(path, qa, "id", str, where),
        question=_field(path, qa, "question", str, where),
        context=context,
        answers=tuple(answers),
        is_impossible=impossible,
    )


def _field(path: pathlib.Path, node, key: str, kind: type, where: str):
    """node[key], which must be a `kind`; bool is not an int here (JSON's true is not 1)."""
    if not isinstance(node, dict) or key not in node:
        raise SquadDataError(f"{path}: {where} has no {key!r}; SQuAD's layout has one there")
    value = node[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SquadDataError(
            f"{path}: {where}.{key} is {type(value).__name__} {str(value)[:40]!r}, "
            f"not {kind.__name__}"
        )
    return value


def _check(source: str, examples: list[Example]) -> None:
    """Question ids key the predictions, so each must be unique; misplaced answers are only
    counted (see the module's docstring)."""
    if not examples:
        raise SquadDataError(f"{source}: holds no questions")
    seen = set()
    for example in examples:
        if example.id in seen:
            raise SquadDataError(
                f"{source}: question id {example.id!r} appears twice; ids key the predictions"
            )
        seen.add(example.id)
    answers = [(e.context, a) for e in examples for a in e.answers]
    misplaced = sum(c[a.start : a.start + len(a.text)] != a.text for c, a in answers)
    if misplaced:
        logging.warning(
            "%s: %d of %d answers' text does not sit at its answer_start; their spans are "
            "read from answer_start and the text's length",
            source,
            misplaced,
            len(answers),
        )


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
