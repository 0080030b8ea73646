"""A corpus prepared once: read by two methods without tokenizing, replayed exactly on
resume, held in memory by the batch rather than by the corpus, refused in one line when a
shard is missing or corrupt; a workdir that began on the old per-workdir cache refused in
one line, untouched; `bench input`'s measurements."""

import pathlib
import shutil
import sys
import tracemalloc

import numpy as np
import pytest
import run_helpers as rh
from text_corpora import sample_document, write_corpus
from tiny_configs import tiny_run_config

from configs import default
from maelm_jax.checkpoints import workdir_lease
from maelm_jax.config import configdict
from maelm_jax.data import input_speed, preparation, prepared, shards
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.batches import TrainBatches
from maelm_jax.data.input_pipeline import create_datasets
from maelm_jax.data.tokenizer import Tokenizer

NUM_SHARDS = 4
RUN = dict(num_train_steps=4, checkpoint_every_steps=2, eval_batches=0)


def _prepare(root, docs: int, **overrides) -> dict:
    corpus = write_corpus(root / "corpus", [sample_document(i) for i in range(docs)])
    config = tiny_run_config(corpus, data_dir=str(root / "data"), **RUN, **overrides)
    report = preparation.prepare(configdict.freeze(config).data, NUM_SHARDS, workers=1)
    return {"config": config, "report": report}


@pytest.fixture(scope="module")
def ready(tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("prepared"), 300)


@pytest.fixture
def no_tokenizing(monkeypatch):
    """Any encode or tokenizer training from here on fails the test."""

    def boom(*args, **kwargs):
        raise AssertionError("tokenized text although a prepared corpus matches")

    for name in ("encode", "encode_batch", "encode_query"):
        monkeypatch.setattr(Tokenizer, name, boom)
    monkeypatch.setattr(tokenizer_lib, "train", boom)


def test_two_methods_train_on_it_without_tokenizing_and_resume_replays_exactly(
    ready, tmp_path, no_tokenizing
):
    """MLM and MAE-LM in new workdirs read the same shards (the fixture prepared them
    before encode was patched to raise). The MAE-LM run, cut back to its step-2 checkpoint
    and rerun, logs exactly the uninterrupted run's losses for steps 3 and 4."""
    mlm = ready["config"].copy_and_resolve_references()
    mlm.objective, mlm.num_train_steps, mlm.eval_batches, mlm.eval_every_steps = "mlm", 2, 1, 2
    assert rh.train_in_process(mlm, tmp_path / "mlm").keys() == {1, 2}  # and eval, fill-in

    config, workdir = ready["config"], tmp_path / "mae_lm"
    expected = rh.train_in_process(config, workdir)
    assert sorted(expected) == [1, 2, 3, 4]
    shutil.rmtree(rh.step_dirs(workdir)[4])  # as if killed after the step-2 save
    assert rh.good_steps(workdir)[-1] == 2
    rerun = rh.train_in_process(config, workdir)
    assert rerun == {s: expected[s] for s in (3, 4)}


def test_mapped_shards_replay_every_batch(ready, no_tokenizing):
    """Two openings (a resumed run's is the second) give identical batches, equal to the
    same blocks held in memory; every train shard is a map, not a copy."""
    data = configdict.freeze(ready["config"]).data
    tokenizer = Tokenizer.from_path(ready["report"]["tokenizer"])
    first, again = (create_datasets(data, tokenizer, 1, 2) for _ in range(2))
    assert all(isinstance(a, np.memmap) for a in first.train.blocks.arrays)
    assert first.train.blocks.dtype == np.uint16
    in_memory = np.asarray(first.train.blocks)
    assert len(in_memory) == first.train_blocks > 8
    held = TrainBatches(in_memory, 4, data.seed, 1)
    for step in (0, 1, 7, 50, 51):  # past several epochs
        batch = first.train.batch(step)
        assert batch.dtype == np.int32
        np.testing.assert_array_equal(batch, again.train.batch(step))
        np.testing.assert_array_equal(batch, held.batch(step))
    assert first.train.state(51) == again.train.state(51)


def _peak_bytes(config) -> int:
    tokenizer = Tokenizer.from_path(prepared.tokenizer_path(config))
    tracemalloc.start()
    try:
        data = create_datasets(config, tokenizer, 0, 1)
        for step in range(8):
            data.train.batch(step)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_a_ten_times_larger_corpus(tmp_path):
    """The peak of what numpy and Python allocate to open (and check) the corpus and draw 8
    batches, in int32 blocks: a 10x corpus adds at most its epoch permutation (8 bytes a
    block), not its blocks."""
    long = {"seq_len": 128, "model.max_positions": 128}
    runs = [_prepare(tmp_path / str(n), n, **long) for n in (800, 8000)]
    block_bytes = 128 * 4
    blocks = [r["report"]["blocks"] for r in runs]
    assert blocks[1] > 9 * blocks[0] > 90
    held = [_peak_bytes(configdict.freeze(r["config"]).data) / block_bytes for r in runs]
    # A copy of the share would add blocks[1] - blocks[0] (half that in uint16); hashing
    # holds one 1 MiB buffer, which a shard under 1 MiB may not fill (and a gfile-backed
    # path, once tensorflow is imported, reads in 1 MiB chunks).
    hash_buffer = shards._HASH_CHUNK / block_bytes
    assert held[1] - held[0] < 0.05 * (blocks[1] - blocks[0]) + hash_buffer, (held, blocks)
    assert hash_buffer < 0.5 * (blocks[1] - blocks[0])  # still catches a uint16 copy


def _break(ready, tmp_path, how: str):
    """A copy of the prepared data with one train shard deleted or changed, and its config."""
    data_dir = tmp_path / "data"
    shutil.copytree(ready["config"].data_dir, data_dir)
    config = ready["config"].copy_and_resolve_references()
    config.data_dir = str(data_dir)
    directory = prepared.blocks_directory(configdict.freeze(config).data, NUM_SHARDS)
    entry = shards.read_manifest(directory)["splits"]["train"][2]
    path = directory / entry["file"]
    if how == "missing":
        path.unlink()
    else:
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0xFF
        path.write_bytes(bytes(raw))
    return config, path, entry["sha256"]


def test_a_missing_or_corrupt_shard_stops_the_run_in_one_line(ready, tmp_path):
    """Both CLI runs at once: exit 1, a last line naming the shard, the manifest's checksum
    and prepare_data, no traceback, no step trained, the prepared files as they were."""
    cases = {}
    for how in ("missing", "corrupt"):
        config, path, sha = _break(ready, tmp_path / how, how)
        before = rh.checksums(tmp_path / how / "data")
        workdir = tmp_path / how / "work"
        proc = rh.start(config, workdir, tmp_path / how / "log")
        cases[how] = (proc, path, sha, before, workdir)
    for how, (proc, path, sha, before, workdir) in cases.items():
        status, output = rh.finish(proc, tmp_path / how / "log")
        assert status == 1, output[-3000:]
        last = output.strip().splitlines()[-1]
        assert last.startswith("maelm_jax: error: prepared shard "), last
        assert str(path) in last and sha in last and "prepare_data" in last, last
        assert ("is missing" if how == "missing" else "is corrupt") in last, last
        assert "Traceback" not in output, output[-3000:]
        assert not rh.good_steps(workdir)
        assert rh.checksums(tmp_path / how / "data") == before


def _snapshot(root: pathlib.Path) -> tuple[dict, dict]:
    """Every file's digest and every folder's mtime under `root`: what "untouched" compares
    (a file made and deleted again, such as a lease, still moves its folder's mtime)."""
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    return rh.checksums(root), {str(p): p.stat().st_mtime_ns for p in folders}


def test_a_workdir_on_the_old_per_workdir_cache_is_refused_in_one_line_untouched(tmp_path):
    """Versions before 2026-11-26 trained on WORKDIR/data_cache/, which nothing reads now:
    resuming such a run on the prepared corpus would change its batches unseen, so the real
    command stops before it writes anything, naming the folder and the two ways on."""
    workdir = tmp_path / "old"
    cache = workdir / workdir_lease.OLD_DATA_CACHE
    cache.mkdir(parents=True)
    # A name and content as those versions wrote them (process 0 of 1's train blocks).
    blocks = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    np.save(cache / "text_corpus_.txt-train-0of1-815dc85b8db97841.npy", blocks)
    (workdir / tokenizer_lib.MODEL_FILENAME).write_bytes(b"the old run's tokenizer")
    before = _snapshot(workdir)
    status, output = rh.run(default.get_config(), workdir, timeout=120)
    assert status == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert output.count("maelm_jax: error:") == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"maelm_jax: error: {cache} is the per-workdir data cache"), last
    assert "give a new --workdir" in last and f"delete {cache} to resume" in last, last
    assert _snapshot(workdir) == before


def test_bench_input_measures_the_child_alone(ready, tmp_path):
    """The peak RSS is the child's own (this test process is far larger than a bare
    Python), and the delivered rate counts the rows it was asked for."""
    small = input_speed.run_and_measure(
        [sys.executable, "-c", "import time; time.sleep(0.3)"], tmp_path
    )
    big = input_speed.run_and_measure(
        [sys.executable, "-c", "import time; b = bytearray(300 << 20); time.sleep(0.3)"],
        tmp_path,
    )
    assert small["returncode"] == big["returncode"] == 0
    assert 0 < small["peak_rss_mb"] < 100 < 300 < big["peak_rss_mb"] < 400
    data = configdict.freeze(ready["config"]).data
    tokenizer = Tokenizer.from_path(ready["report"]["tokenizer"])
    rate = input_speed.delivered_tokens_per_s(data, tokenizer, rows=64, steps=5)
    assert rate["tokens_per_sec"] > 0 and rate["rows"] == 64
    assert rate["train_blocks"] == ready["report"]["blocks"]
