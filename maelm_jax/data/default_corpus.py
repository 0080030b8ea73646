"""The embedded corpus `python_docs`: English prose that every CPython installation carries.

No download, so the default config trains anywhere. Two sources, read in a fixed order:

* `pydoc_data.topics.topics`, the text of the Python language reference (one entry per topic);
* docstrings of the pure-Python standard library, read with `ast` from the source files
  (nothing is imported), skipping test suites, IDLE, lib2to3, codecs and installed packages.

Both are cut into paragraphs (blank-line separated). A paragraph is kept only when it reads
like prose (`is_prose`): doctests, grammar rules, code listings and tables fail that test.
Each kept paragraph is reflowed onto one line, exact repeats are dropped, and consecutive
paragraphs of one source are grouped into documents of at most `MAX_DOCUMENT_CHARS`
characters, one paragraph per line. Documents of that size, rather than one per module,
keep per-process shards balanced and make a held-out fraction a fraction of the text, not of
a few large modules.

The text depends on the Python version (its docs and stdlib), never on anything random.
Importing this module registers the TFDS builder, so `tfds.builder("python_docs")` works.
"""

import ast
import os
import re
import sysconfig
import textwrap
import warnings
from collections.abc import Iterator
from typing import ClassVar

import tensorflow_datasets as tfds

NAME = "python_docs"
MAX_DOCUMENT_CHARS = 2000
MIN_WORDS = 4
MIN_WORD_SHARE = 0.8

# Directory names never read: tests, tools and data that are not the library's own prose.
_SKIPPED_DIRS = frozenset(
    {
        "__pycache__",
        "__phello__",
        "encodings",
        "ensurepip",
        "idle_test",
        "idlelib",
        "lib2to3",
        "pydoc_data",
        "test",
        "tests",
        "turtledemo",
    }
)
_WORD = re.compile(r"[A-Za-z]+(?:['’-][A-Za-z]+)*")
_EDGE_PUNCTUATION = "\"'`*()[]{}<>,.;:!?“”‘’"
_UNDERLINE = re.compile(r"^\s*([*=~^#+-])\1{2,}\s*$")
_BULLET = re.compile(r"^(?:[*+-]|\d+\.)\s+")


def is_prose(paragraph: str) -> bool:
    """True when most whitespace tokens are words: at least `MIN_WORD_SHARE` of them, once
    surrounding punctuation is stripped, are alphabetic (with inner ' or -) and there are at
    least `MIN_WORDS`. Code (`f(x) = y`, `>>>`, `::=`) and tables fall well below that."""
    tokens = paragraph.split()
    if len(tokens) < MIN_WORDS or ">>>" in tokens:
        return False
    words = sum(1 for t in tokens if _WORD.fullmatch(t.strip(_EDGE_PUNCTUATION)))
    return words >= MIN_WORDS and words >= MIN_WORD_SHARE * len(tokens)


def _parses_as_python(block: str) -> bool:
    """Code listings that happen to be wordy (`if not x: raise Error`) still parse; prose of
    `MIN_WORDS` or more words essentially never does."""
    try:
        _quiet_parse(textwrap.dedent(block))
    except (SyntaxError, ValueError):
        return False
    return True


def _quiet_parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse` without the SyntaxWarnings (`"\\d"` escapes) it prints for old sources."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, filename=filename)


def _paragraphs(text: str) -> Iterator[str]:
    """Prose paragraphs of `text`, each on one line with single spaces, headings' underlines
    and list bullets removed. Blocks with `#` comment lines or that parse as Python are code."""
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if not _UNDERLINE.match(line)]
        if any(line.lstrip().startswith("#") for line in lines):
            continue
        if _parses_as_python("\n".join(lines)):
            continue
        paragraph = " ".join(" ".join(lines).split())
        paragraph = _BULLET.sub("", paragraph)
        if is_prose(paragraph):
            yield paragraph


def _stdlib_files(root: str) -> Iterator[str]:
    """The standard library's `.py` files in sorted path order (installed packages and
    directories like `config-3.11-...` and `lib-dynload` skipped: their names have a '-')."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and "-" not in d)
        for name in sorted(filenames):
            if name.endswith(".py") and not name.startswith("test_"):
                yield os.path.join(dirpath, name)


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module and of its classes and functions, in source order."""
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield doc
    for node in getattr(tree, "body", ()):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _docstrings(node)


def _sources() -> Iterator[tuple[str, str]]:
    """(key, text) per source: one per reference topic, one per stdlib module."""
    from pydoc_data import topics  # a data module: importing it runs no library code

    for name in sorted(topics.topics):
        yield f"topic/{name}", topics.topics[name]
    root = sysconfig.get_paths()["stdlib"]
    for path in _stdlib_files(root):
        try:
            with open(path, "rb") as f:
                tree = _quiet_parse(f.read(), filename=path)
        except (SyntaxError, ValueError, OSError):
            continue  # a file this Python cannot parse holds no docstrings for us
        module = os.path.relpath(path, root).removesuffix(".py").replace(os.sep, ".")
        yield f"stdlib/{module}", "\n\n".join(_docstrings(tree))


def keyed_documents() -> Iterator[tuple[str, str]]:
    """(stable key, document) pairs of the corpus, in a fixed order; see the module doc."""
    seen: set[str] = set()
    for key, text in _sources():
        group: list[str] = []
        size = 0
        part = 0
        for paragraph in _paragraphs(text):
            if paragraph in seen:
                continue
            seen.add(paragraph)
            if group and size + 1 + len(paragraph) > MAX_DOCUMENT_CHARS:
                yield f"{key}/{part}", "\n".join(group)
                group, size, part = [], 0, part + 1
            group.append(paragraph)
            size += len(paragraph) + (1 if size else 0)
        if group:
            yield f"{key}/{part}", "\n".join(group)


def documents() -> Iterator[str]:
    """The corpus' documents in a fixed order; paragraphs are separated by single newlines."""
    for _, document in keyed_documents():
        yield document


class PythonDocs(tfds.core.GeneratorBasedBuilder):
    """English prose from Python's reference documentation and standard-library docstrings."""

    VERSION = tfds.core.Version("1.0.0")
    # No checksums file to find: nothing is downloaded. Setting this also skips TFDS's lookup
    # of the builder's source path, which needs the `importlib_resources` package.
    code_path = None
    RELEASE_NOTES: ClassVar[dict[str, str]] = {
        "1.0.0": "Reference topics and stdlib docstrings, prose paragraphs only."
    }

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=__doc__,
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            homepage="https://docs.python.org/3/",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for key, text in keyed_documents():
            yield key, {"text": text}


def builder(data_dir: str | None = None) -> tfds.core.DatasetBuilder:
    """The `python_docs` builder, prepared into `data_dir` (TFDS's default when None) if it is
    not there yet. Preparing takes a few seconds; callers on several hosts decide who does it."""
    b = tfds.builder(NAME, data_dir=data_dir)
    if not b.is_prepared():
        b.download_and_prepare()
    return b
