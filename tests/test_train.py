"""End to end: a run on a small corpus learns and logs; the CLI; bad input. (The command's
one-line errors, as a user meets them: test_bad_input.py.)"""

import glob
import os
import re
import subprocess
import sys

import pytest
from etils import epath
from process_runs import TPU_INIT_ERRORS, users_machine
from tensorboard.backend.event_processing import event_accumulator
from text_corpora import sample_document, write_corpus
from tiny_configs import REPO_ROOT, printed_by_fresh_python, tiny_run_config

from maelm_jax.checkpoints import manifest
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import input_pipeline
from maelm_jax.training import metric_logging, train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    docs = [sample_document(i) for i in range(240)]
    return write_corpus(tmp_path_factory.mktemp("corpus"), docs)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """(workdir, metrics) of one tiny run. (That a run repeats its losses exactly, in a new
    process too, test_checkpointing.py's kill -9 test holds: the killed run and its rerun
    against the uninterrupted baseline, step for step.)"""
    workdir = tmp_path_factory.mktemp("run")
    train.train_and_evaluate(configdict.freeze(tiny_run_config(corpus)), workdir)
    return workdir, metric_logging.read_metrics(workdir)


def test_loss_falls_and_both_logs_are_written(trained):
    workdir, metrics = trained
    losses = [metrics[s]["train/loss"] for s in sorted(metrics) if "train/loss" in metrics[s]]
    assert len(losses) == 24
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < first - 1.0, losses
    evals = [metrics[s]["eval/loss"] for s in (12, 24)]
    assert evals[1] < evals[0], evals
    for key in ("train/accuracy", "learning_rate", "tokens_per_sec"):
        assert key in metrics[24]
    # The context-free baseline, computed once, sits beside every eval loss.
    baselines = {metrics[s]["eval/unigram_loss"] for s in (0, 12, 24)}
    assert len(baselines) == 1, baselines
    assert 0 < baselines.pop() < metrics[0]["eval/loss"]
    events = glob.glob(os.path.join(workdir, "events.out.tfevents.*"))
    assert len(events) == 1
    acc = event_accumulator.EventAccumulator(events[0], size_guidance={"tensors": 0})
    acc.Reload()
    assert "train/loss" in acc.Tags()["tensors"]
    assert len(acc.Tensors("train/loss")) == 24


def test_the_loop_and_its_writers_load_without_tensorflow(tmp_path):
    """TensorFlow (~5 s of import per process) is not needed to train on local text and log:
    a fresh process imports the loop, writes every log file, and has not loaded it. (The
    TensorBoard stub behind tensorboard's own EventFileWriter would: on its first write.)"""
    code = (
        "import sys; from maelm_jax.training import metric_logging, train\n"
        f"w = metric_logging.create_writer({str(tmp_path)!r})\n"
        "w.write_scalars(1, {'train/loss': 2.5}); w.close()\n"
        "print('tensorflow' in sys.modules)"
    )
    assert printed_by_fresh_python(code) == ["False"]
    (events,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    acc = event_accumulator.EventAccumulator(events, size_guidance={"tensors": 0})
    acc.Reload()
    (value,) = acc.Tensors("train/loss")
    assert value.step == 1 and value.tensor_proto.float_val == [2.5]
    assert metric_logging.read_metrics(tmp_path) == {1: {"step": 1, "train/loss": 2.5}}


def test_cli_trains_the_default_config(tmp_path):
    """The README's command: the default config, a workdir relative to the current dir, and
    JAX left to choose its backend as on a user's machine: no TPU errors on a CPU. The
    machine ships mpi4py, as NVIDIA's containers do: one process is still no cluster."""
    env = users_machine(dict(os.environ, TFDS_DATA_DIR=str(tmp_path / "tfds")))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = subprocess.run(
        [sys.executable, "-m", "maelm_jax.main", f"--config={REPO_ROOT}/configs/default.py",
         "--config.num_train_steps=3", "--workdir=workdirs/default"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for error in TPU_INIT_ERRORS:
        assert error not in result.stderr, result.stderr[:3000]
    # The closing fill-in printout (fill_in.py): passages with numbered blanks, then per
    # blank the true piece and the model's three guesses with their probabilities.
    printout = result.stdout[result.stdout.index("Fill in the blanks") :]
    passages = re.findall(r"^(\d)\. \.\.\.(.*)\.\.\.$", printout, re.M)
    assert [n for n, _ in passages] == ["1", "2", "3"], printout
    assert all("[1]" in text and re.search("[a-z]{3}", text) for _, text in passages), printout
    guesses = re.findall(r"^   \[\d\] '.+' +model: (.+)$", printout, re.M)
    assert len(guesses) >= 3, printout
    assert all(len(re.findall(r"\d+%", g)) == 3 for g in guesses), printout
    workdir = tmp_path / "workdirs" / "default"
    metrics = metric_logging.read_metrics(workdir)
    assert metrics[0]["eval/loss"] > metrics[3]["eval/loss"]
    assert "train/loss" in metrics[3]
    assert manifest.problem_with(epath.Path(workdir / "checkpoints" / "3")) is None


@pytest.mark.parametrize(
    "overrides,named",
    [
        ({"mask_rate": 0.0}, "mask_rate=0.0"),
        ({"mask_rate": 1.0}, "mask_rate=1.0"),
        ({"mask_rate": -0.2}, "mask_rate=-0.2"),
        ({"seq_len": 64}, "seq_len=64 exceeds model.max_positions=32"),
        ({"dataset": "no_such_dataset_xyz"}, "dataset='no_such_dataset_xyz'"),
        ({"vocab_path": "/nonexistent/spm.model"}, "vocab_path='/nonexistent/spm.model'"),
    ],
)
def test_bad_config_values_are_named(corpus, tmp_path, overrides, named):
    config = tiny_run_config(corpus, **overrides)
    with pytest.raises(ConfigError, match="^" + named.replace("(", r"\(").replace(".", r"\.")):
        train.train_and_evaluate(configdict.freeze(config), tmp_path)


def test_text_glob_matching_nothing(tmp_path):
    with pytest.raises(ConfigError, match="matches no file"):
        train.train_and_evaluate(
            configdict.freeze(tiny_run_config(f"text:{tmp_path}/none/*.txt")), tmp_path
        )


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n   \n\t\n")
    dataset = f"text:{tmp_path}/*.txt"
    what = f"dataset={dataset!r}: its 1 file(s) hold only whitespace or nothing; give UTF-8"
    with pytest.raises(ConfigError, match=re.escape(what)):
        train.train_and_evaluate(configdict.freeze(tiny_run_config(dataset)), tmp_path / "run")


def test_batch_not_divisible_by_process_count(corpus):
    config = tiny_run_config(corpus, batch_size=8)
    with pytest.raises(ConfigError, match="batch_size=8 is not divisible by the process count 3"):
        input_pipeline.local_batch_size(configdict.freeze(config).data, 3)
