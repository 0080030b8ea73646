"""Documents: text files and TFDS shares per process, the eval hold-out, the cap, bad sources."""

import collections
import pathlib

import pytest
from text_corpora import data_config, sample_corpus
from tiny_configs import printed_by_fresh_python

from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import default_corpus, documents
from maelm_jax.data.documents import read_documents, source_bytes


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return sample_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def python_docs_dir(tmp_path_factory):
    """Same directory as test_default_corpus.py's fixture: the corpus is built once."""
    data_dir = tmp_path_factory.getbasetemp() / "python_docs_data"
    default_corpus.builder(str(data_dir))
    return str(data_dir)


def test_text_files_are_read_as_blank_line_separated_documents(corpus):
    pattern, docs = corpus
    read = list(read_documents(data_config(pattern, eval_holdout_fraction=0.0), "train", 0, 1))
    assert read == docs


def test_local_text_files_are_read_without_tensorflow(corpus):
    """TensorFlow (~6 s to import) serves URLs and TFDS only: a fresh process reads and sizes
    local text files without importing it."""
    pattern, docs = corpus
    code = (
        "import sys\n"
        "from text_corpora import data_config\n"
        "from maelm_jax.data.documents import read_documents, source_bytes\n"
        f"c = data_config({pattern!r}, eval_holdout_fraction=0.0)\n"
        "print(len(list(read_documents(c, 'train', 0, 1))), source_bytes(c) > 0)\n"
        "print('tensorflow' in sys.modules)\n"
    )
    assert printed_by_fresh_python(code) == [str(len(docs)), "True", "False"]


@pytest.mark.parametrize("count", [2, 3])
def test_text_shards_are_disjoint_and_cover_train_and_eval(corpus, count):
    pattern, docs = corpus
    c = data_config(pattern)
    whole = {}
    for kind in ("train", "eval"):
        shares = [list(read_documents(c, kind, i, count)) for i in range(count)]
        merged = collections.Counter(d for s in shares for d in s)
        assert max(merged.values()) == 1  # no document twice
        assert set(merged) == set(read_documents(c, kind, 0, 1))
        assert all(shares)
        whole[kind] = set(merged)
    assert not whole["train"] & whole["eval"]
    assert whole["train"] | whole["eval"] == set(docs)
    assert 0 < len(whole["eval"]) < len(docs) / 2


@pytest.mark.parametrize("count", [2, 3])
def test_python_docs_shards_are_disjoint_and_cover(python_docs_dir, count):
    c = data_config("python_docs", data_dir=python_docs_dir, eval_holdout_fraction=0.02)
    whole = list(read_documents(c, "train", 0, 1))
    shares = [list(read_documents(c, "train", i, count)) for i in range(count)]
    assert sorted(d for s in shares for d in s) == sorted(whole)
    assert all(len(s) > len(whole) // (count + 1) for s in shares)  # roughly even
    held_out = set(read_documents(c, "eval", 0, 1))
    assert held_out and not held_out & set(whole)


def test_max_documents_caps_the_split_across_processes(corpus):
    pattern, docs = corpus
    c = data_config(pattern, eval_holdout_fraction=0.0, max_documents=7)
    assert list(read_documents(c, "train", 0, 1)) == docs[:7]
    shares = [list(read_documents(c, "train", i, 3)) for i in range(3)]
    # Each process reads its own file, capped at its part of 7 (3 + 2 + 2).
    assert [len(s) for s in shares] == [3, 2, 2]
    assert len({d for s in shares for d in s}) == 7 and all(set(s) <= set(docs) for s in shares)


def test_source_bytes_size_the_packing_job(corpus, python_docs_dir, tmp_path):
    pattern, _ = corpus
    files = sorted(pathlib.Path(pattern.removeprefix("text:")).parent.glob("*.txt"))
    assert source_bytes(data_config(pattern)) == sum(f.stat().st_size for f in files)
    assert source_bytes(data_config("python_docs", data_dir=python_docs_dir)) > 1e6
    assert source_bytes(data_config("no_such_dataset_xyz", data_dir=str(tmp_path))) is None


def test_unknown_tfds_name_is_a_config_error(tmp_path):
    c = data_config("no_such_dataset_xyz", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"no_such_dataset_xyz.*list_builders"):
        read_documents(c, "train", 0, 1)


def test_glob_matching_no_file_is_a_config_error(tmp_path):
    c = data_config(f"text:{tmp_path}/*.missing")
    with pytest.raises(ConfigError, match=r"\*\.missing"):
        read_documents(c, "train", 0, 1)


def test_a_document_over_the_limit_is_refused_naming_the_file_and_its_first_line(
    tmp_path, monkeypatch
):
    """Also one made of many short lines (a file with no blank lines is one document); a
    document of exactly the limit is read."""
    monkeypatch.setattr(documents, "MAX_DOCUMENT_CHARS", 100)
    path = tmp_path / "a.txt"
    path.write_text("A short document.\n\n" + "x" * 99 + "\n\n" + "Nine chars\n" * 11)
    with pytest.raises(ConfigError) as error:
        list(read_documents(data_config(f"text:{tmp_path}/*.txt"), "train", 0, 1))
    assert str(error.value) == (
        f"{path}: the document that starts at line 5 passes 100 characters, the most a "
        "document may hold, at line 14; a document ends at a blank line, so a file without "
        "blank lines is one document: give UTF-8 text files with documents separated by blank "
        "lines"
    )


@pytest.mark.parametrize("count", [1, 2])
def test_files_of_only_whitespace_say_what_text_files_are_needed(tmp_path, count):
    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.txt").write_text(" \n\t\n\n   \n")
    c = data_config(f"text:{tmp_path}/*.txt")
    which = "its 2 file(s)" if count == 1 else "the 1 of its files that process 1 reads"
    with pytest.raises(ConfigError) as error:
        read_documents(c, "train", count - 1, count)
    assert str(error.value) == (
        f"dataset='text:{tmp_path}/*.txt': {which} hold only whitespace or nothing; give UTF-8 "
        "text files with documents separated by blank lines"
    )


def test_unknown_split_is_a_config_error(python_docs_dir, corpus):
    c = data_config("python_docs", data_dir=python_docs_dir, train_split="validation")
    with pytest.raises(ConfigError, match=r"'validation'.*\['train'\]"):
        read_documents(c, "train", 0, 1)
    c = data_config(corpus[0], eval_split="test")
    with pytest.raises(ConfigError, match="eval_split='test'"):
        read_documents(c, "eval", 0, 1)
