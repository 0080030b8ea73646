"""The embedded `python_docs` corpus: registered with TFDS, natural English, deterministic."""

import ast
import re
import warnings

import pytest
import tensorflow_datasets as tfds

from maelm_jax.data import default_corpus


@pytest.fixture(scope="session")
def python_docs_dir(tmp_path_factory):
    """Built once per session; test_input_pipeline.py's fixture reuses the same directory."""
    data_dir = tmp_path_factory.getbasetemp() / "python_docs_data"
    default_corpus.builder(str(data_dir))
    return str(data_dir)


def _texts(data_dir: str) -> list[str]:
    ds = tfds.builder("python_docs", data_dir=data_dir).as_dataset(split="train")
    return [ex["text"].decode() for ex in ds.as_numpy_iterator()]


def test_registered_tfds_builder(python_docs_dir):
    builder = tfds.builder("python_docs", data_dir=python_docs_dir)
    assert builder.is_prepared()
    assert str(builder.version) == "1.0.0"
    assert list(builder.info.splits) == ["train"]
    assert isinstance(builder.info.features["text"], tfds.features.Text)


def test_corpus_is_a_lot_of_natural_text(python_docs_dir):
    texts = _texts(python_docs_dir)
    assert len(texts) >= 500
    assert sum(len(t.encode()) for t in texts) >= 500_000
    assert all(t.strip() for t in texts)
    tokens = [tok.strip("\"'`*()[]{}<>,.;:!?“”‘’") for t in texts for tok in t.split()]
    words = sum(1 for tok in tokens if re.fullmatch(r"[A-Za-z]+(?:['’-][A-Za-z]+)*", tok))
    assert words / len(tokens) > 0.85
    assert len(texts) == len(set(texts))


def test_corpus_has_no_code_listings(python_docs_dir):
    paragraphs = [p for t in _texts(python_docs_dir) for p in t.split("\n")]
    assert not any(">>>" in p or "::=" in p for p in paragraphs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parses = []
        for p in paragraphs:
            try:
                ast.parse(p)
                parses.append(p)
            except SyntaxError:
                pass
    assert not parses, parses[:3]


def test_two_builds_are_identical(python_docs_dir, tmp_path):
    first = _texts(python_docs_dir)
    default_corpus.builder(str(tmp_path))
    assert _texts(str(tmp_path)) == first


@pytest.mark.parametrize(
    "paragraph",
    [
        "An assignment statement evaluates the expression list and assigns the result.",
        "Return True if the TarInfo object is a regular file.",
    ],
)
def test_is_prose_keeps_sentences(paragraph):
    assert default_corpus.is_prose(paragraph)


@pytest.mark.parametrize(
    "paragraph",
    [
        "for i in range(10): print(i, i ** 2)",
        ">>> print('hello world from here')",
        'target_list ::= target ("," target)* [","]',
        "| Type | Meaning | Default | Notes |",
        "Short title",
    ],
)
def test_is_prose_rejects_code_tables_and_fragments(paragraph):
    assert not default_corpus.is_prose(paragraph)
