"""prepare_data: tokenizer, packed shards and statistics next to the data, built once (also
by two processes at once), found by training, which then builds nothing; file:// paths; each
host reads only its own text files."""

import collections
import json
import logging
import math
import os
import pathlib
import socket
import subprocess
import sys
import types

import numpy as np
import pytest
from text_corpora import sample_document, write_corpus
from tiny_configs import REPO_ROOT, tiny_run_config

from maelm_jax import prepare_data
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import preparation, prepared, shards
from maelm_jax.data.documents import read_documents
from maelm_jax.data.shard_writer import pack_documents
from maelm_jax.data.tokenizer import MODEL_FILENAME, Tokenizer
from maelm_jax.training import metric_logging, train

VOCAB = 400  # python_docs needs more than 344 pieces (bytes, specials, its characters)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = [sample_document(i) for i in range(120)]
    return write_corpus(tmp_path_factory.mktemp("corpus"), docs, files=3)


def _files(directory) -> dict[str, int]:
    """Every file under `directory` with its mtime in ns."""
    return {
        os.path.join(root, name): os.stat(os.path.join(root, name)).st_mtime_ns
        for root, _, names in os.walk(directory)
        for name in names
    }


def data_config(config):
    return configdict.freeze(config).data


def _check_statistics(report: dict, config) -> None:
    """The report against an independent count with the stored tokenizer and the packer,
    over the shards' shares of the training documents."""
    tokenizer = Tokenizer.from_path(report["tokenizer"])
    assert tokenizer.fingerprint == report["tokenizer_sha256"]
    n = report["num_shards"]
    shares = [list(read_documents(config, "train", i, n)) for i in range(n)]
    ids = [[tokenizer.encode(d) for d in share] for share in shares]
    counts = collections.Counter(i for share in ids for doc in share for i in doc)
    p = np.array(list(counts.values())) / counts.total()
    assert report["documents"] == sum(map(len, shares)) > 0
    assert report["tokens"] == counts.total()
    assert report["blocks"] == sum(len(pack_documents(s, config.seq_len)) for s in ids if s)
    assert report["unigram_entropy_bits"] == pytest.approx(-(p * np.log2(p)).sum())


def test_text_glob_is_prepared_once(corpus, tmp_path):
    config = data_config(tiny_run_config(corpus, data_dir=str(tmp_path), vocab_size=VOCAB))
    report = preparation.prepare(config)
    assert report["built"]
    directory = prepared.directory(config)
    assert report["prepared_dir"] == str(directory)
    assert str(directory).startswith(str(tmp_path))
    stored = json.loads((directory / prepared.STATISTICS_FILENAME).read_text())
    assert {k: report[k] for k in stored} == stored
    _check_statistics(report, config)
    table = prepare_data.format_report(report)
    assert f"blocks of {config.seq_len}" in table and "bits/token" in table

    before = _files(tmp_path)
    again = preparation.prepare(config)
    assert not again["built"]
    assert _files(tmp_path) == before  # nothing rewritten, nothing added
    assert {k: v for k, v in again.items() if k != "built"} == {
        k: v for k, v in report.items() if k != "built"
    }


def test_two_processes_at_once_build_it_once_on_the_embedded_corpus(tmp_path_factory):
    """Two real `prepare_data` processes on `python_docs`, data_dir given as a file:// URL."""
    data_dir = tmp_path_factory.getbasetemp() / "python_docs_data"  # shared with other tests
    overrides = dict(max_documents=120, vocab_size=VOCAB)
    config_file = tmp_path_factory.mktemp("config") / "data_config.py"
    config_file.write_text(
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT / 'tests')!r})\n"
        "from tiny_configs import tiny_run_config\n\n\n"
        f"def get_config():\n    return tiny_run_config('python_docs', **{overrides!r})\n"
    )
    command = [
        sys.executable, "-m", "maelm_jax.prepare_data", f"--config={config_file}",
        f"--data_dir=file://{data_dir}", "--json",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(2)
    ]
    reports = []
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err.decode()[-2000:]
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert sorted(r["built"] for r in reports) == [False, True]
    assert {k: v for k, v in reports[0].items() if k != "built"} == {
        k: v for k, v in reports[1].items() if k != "built"
    }
    config = data_config(tiny_run_config("python_docs", data_dir=str(data_dir), **overrides))
    assert (data_dir / "python_docs").is_dir()  # the TFDS dataset, prepared
    prepared_dir = prepared.directory(config)
    assert reports[0]["prepared_dir"] == str(prepared_dir)  # the file:// URL, resolved
    assert not list((prepared_dir / prepared.CLAIMS_DIRNAME).iterdir())
    assert sorted(p.name for p in prepared_dir.iterdir() if not p.name.startswith(".")) == [
        prepared.blocks_directory(config, reports[0]["num_shards"]).name,
        prepared.STATISTICS_FILENAME,
        prepared.TOKENIZER_FILENAME,
    ]
    assert reports[0]["documents"] <= 120
    _check_statistics(reports[0], config)


def test_training_on_prepared_data_through_file_urls_builds_nothing(corpus, tmp_path, caplog):
    data_dir, workdir = tmp_path / "data", tmp_path / "work"
    overrides = dict(vocab_size=VOCAB, num_train_steps=1, eval_batches=0)
    ready = preparation.prepare(
        data_config(tiny_run_config(corpus, data_dir=str(data_dir), **overrides))
    )
    caplog.set_level(logging.INFO)
    config = tiny_run_config(
        corpus, data_dir=f"file://{data_dir}", checkpoint_every_steps=1, **overrides
    )
    train.train_and_evaluate(configdict.freeze(config), f"file://{workdir}")
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("Using the prepared tokenizer") for m in messages)
    assert not any(m.startswith("Trained a") for m in messages)  # no tokenizer training
    assert any(m.startswith("Reading the prepared corpus") for m in messages)
    assert not any(m.startswith(("Preparing", "Packed")) for m in messages)  # mapped, not built
    prepared_model = pathlib.Path(ready["tokenizer"])
    assert prepared_model.is_relative_to(data_dir)
    assert (workdir / MODEL_FILENAME).read_bytes() == prepared_model.read_bytes()
    assert (workdir / "checkpoints" / "1").is_dir()
    assert max(metric_logging.read_metrics(workdir)) == 1


def test_each_host_reads_only_its_text_files(tmp_path):
    docs = [sample_document(i) for i in range(30)]
    config = data_config(
        tiny_run_config(write_corpus(tmp_path, docs, files=3), eval_holdout_fraction=0.0)
    )
    per_file = [docs[0:10], docs[10:20], docs[20:30]]
    shares = [list(read_documents(config, "train", i, 2)) for i in range(2)]
    assert shares == [per_file[0] + per_file[2], per_file[1]]
    # Fewer files than hosts: every host scans every file and keeps every 4th document.
    shares = [list(read_documents(config, "train", i, 4)) for i in range(4)]
    assert shares == [docs[i::4] for i in range(4)]
    assert math.fsum(len(s) for s in shares) == len(docs)


def test_an_interrupted_prepare_resumes_with_any_worker_count_and_repairs_a_shard(corpus, tmp_path):
    """Killed mid-way (a dead process's claim left, no manifest, some shards unfinished), a
    rerun with 2 spawned workers takes over, rebuilds only the unfinished shards, and they
    are byte-identical to the 1-worker build; a later corrupt shard is rebuilt alone."""
    config = data_config(tiny_run_config(corpus, data_dir=str(tmp_path), vocab_size=VOCAB))
    first = preparation.prepare(config, num_shards=4, workers=1)
    directory = pathlib.Path(first["blocks_dir"])
    manifest = shards.read_manifest(directory)
    (directory / shards.MANIFEST_FILENAME).unlink()
    unfinished = ["train-00003-of-00004.npy", "eval-00000-of-00004.npy"]
    for name in unfinished:
        (directory / f"{name}.json").unlink()
    dead = subprocess.Popen(["true"])
    dead.wait()
    claim = directory / prepared.CLAIMS_DIRNAME / f"{0:020d}-dead"
    claim.write_text(f"host={socket.gethostname()} pid={dead.pid}\n")
    kept = {p.name: p.stat().st_mtime_ns for p in directory.glob("*.npy")}

    again = preparation.prepare(config, num_shards=4, workers=2)
    assert again["built"] and again["pack_workers"] == 2 and not claim.exists()
    assert shards.read_manifest(directory)["splits"] == manifest["splits"]  # same sha256s
    now = {p.name: p.stat().st_mtime_ns for p in directory.glob("*.npy")}
    assert sorted(n for n in kept if now[n] != kept[n]) == sorted(unfinished)

    shard = directory / manifest["splits"]["train"][1]["file"]
    shard.write_bytes(shard.read_bytes()[:-5])
    repaired = preparation.prepare(config, num_shards=4, workers=1)
    assert repaired["repaired"] == [shard.name] and repaired["built"]
    assert shards.read_manifest(directory)["splits"] == manifest["splits"]


def test_a_tfds_beam_builder_gets_the_beam_options(monkeypatch, tmp_path):
    """`--beam_options` reach the builder's download_and_prepare as Beam PipelineOptions
    flags (a stand-in Beam module records them); without Beam installed, one clear error."""
    seen = {}

    class Builder:
        data_dir_root = str(tmp_path)

        def is_prepared(self):
            return False

        def download_and_prepare(self, download_config=None):
            seen["config"] = download_config

    class PipelineOptions:
        def __init__(self, flags):
            self.flags = flags

    module = types.ModuleType("apache_beam.options.pipeline_options")
    module.PipelineOptions = PipelineOptions
    monkeypatch.setattr(preparation.tfds, "builder", lambda *a, **k: Builder())
    config = data_config(tiny_run_config("wikipedia/20230601.en", data_dir=str(tmp_path)))
    for name in ("apache_beam", "apache_beam.options"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    preparation.prepare_source(config, "runner=DirectRunner, direct_num_workers=2")
    flags = seen["config"].beam_options.flags
    assert flags == ["--runner=DirectRunner", "--direct_num_workers=2"]
    preparation.prepare_source(config)
    assert seen["config"] is None  # TFDS's own default

    monkeypatch.setitem(sys.modules, module.__name__, None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs Apache Beam: pip install -e '\.\[beam\]'"):
        preparation.prepare_source(config, "runner=DirectRunner")
