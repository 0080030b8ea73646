"""Bad input and faults as a new user or a pod operator meets them: one line, no traceback.

Every case is a real `python -m maelm_jax.<command>` process (exit status, stderr and the
prompt exit are the point) aimed at the workdir of one earlier, finished run, whose files
must be byte-identical afterwards. That earlier run won its workdir from a second launch of
the same command started at the same moment, which must be refused before it writes. Most
cases fail before TensorFlow, Orbax or the model are imported, so each costs about one
interpreter start.
"""

import json
import subprocess
import sys
import time

import pytest
import run_helpers as rh
from process_runs import process_env
from text_corpora import sample_document, write_corpus
from tiny_configs import REPO_ROOT, tiny_run_config

from maelm_jax.checkpoints import workdir_lease
from maelm_jax.config import configdict
from maelm_jax.config.run_config import ConfigError
from maelm_jax.data import documents
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.data.input_pipeline import load_tokenizer

STEPS = 24
USAGE = 2  # flags the parser rejects
INVALID = 1  # values rejected once parsed, and failed runs


def run_command(args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO_ROOT,
        env=process_env(1),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def assert_one_line_error(result, status, *fragments, prog="maelm_jax"):
    assert result.returncode == status, result.stderr[-3000:]
    line = last_line(result)
    assert line.startswith(f"{prog}: error: "), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in line, line
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), [sample_document(i) for i in range(160)])


def config_of(corpus, **overrides):
    return tiny_run_config(corpus, **({"eval_batches": 0, "num_train_steps": STEPS} | overrides))


@pytest.fixture(scope="module")
def earlier_run(corpus, tmp_path_factory):
    """(workdir, the race) of a finished run that won its workdir from a second launch of
    the same command, both started at once: the race holds (winner, loser) as
    (pid, exit status, output, seconds to exit)."""
    workdir = tmp_path_factory.mktemp("earlier") / "run"
    started = time.monotonic()
    logs = [workdir.parent / f"launch{i}.log" for i in range(2)]
    launches = [rh.start(config_of(corpus), workdir, log) for log in logs]
    seconds = [None, None]
    while None in seconds and time.monotonic() - started < 600:
        for i, launch in enumerate(launches):
            if seconds[i] is None and launch.poll() is not None:
                seconds[i] = time.monotonic() - started
        time.sleep(0.05)
    ended = [
        (launch.pid, *rh.finish(launch, log), seconds[i])
        for i, (launch, log) in enumerate(zip(launches, logs, strict=True))
    ]
    winner, loser = sorted(ended, key=lambda e: e[1])
    assert winner[1] == 0, winner[2][-3000:]
    return workdir, (winner, loser)


def test_of_two_runs_started_at_once_on_one_workdir_one_is_refused_before_it_writes(
    earlier_run,
):
    """The loser stops at the lease, before the data, the tokenizer or a step, with one line
    naming the winner; the winner writes every step once and releases the lease."""
    workdir, (winner, loser) = earlier_run
    _, status, output, seconds = loser
    assert status == INVALID, output[-3000:]
    line = output.strip().splitlines()[-1]
    assert line.startswith(f"maelm_jax: error: workdir '{workdir}' is in use by another run"), line
    assert f"pid {winner[0]}," in line
    assert "Traceback" not in output, output[-3000:]
    assert "train.py:" not in output  # no log line of the training loop: it never began
    assert seconds < 60
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    steps = [row["step"] for row in map(json.loads, lines) if "train/loss" in row]
    assert steps == list(range(1, STEPS + 1)), steps  # every step once
    assert rh.good_steps(workdir)[-1] == STEPS
    assert not (workdir / workdir_lease.LEASE_FILENAME).exists()  # released at the end


@pytest.fixture
def unchanged(earlier_run):
    """The earlier run's workdir; fails the test if any of its files changed."""
    workdir = earlier_run[0]
    before = rh.checksums(workdir)
    yield workdir
    assert rh.checksums(workdir) == before


# (flags after the config's own, exit status, fragments the last line must hold)
MAIN_CASES = {
    "unknown_key": (
        USAGE,
        ["--config.bogus_key=1"],
        ["--config.bogus_key=1", "has no key 'bogus_key'", "allowed keys: adam_b1"],
    ),
    "nested_typo": (
        USAGE,
        ["--config.model.num_layer=2"],
        ["config.model has no key 'num_layer'", "num_layers"],
    ),
    "wrong_type": (USAGE, ["--config.mask_rate=abc"], ["--config.mask_rate=abc", "takes a float"]),
    "missing_config_file": (USAGE, ["--config=configs/nope.py"], ["configs/nope.py: no such file"]),
    "config_without_get_config": (
        USAGE,
        ["--config=maelm_jax/model/loss.py"],
        ["maelm_jax/model/loss.py defines no get_config()"],
    ),
    "several_bad_values_at_once": (
        INVALID,
        ["--config.learning_rate=-1", "--config.warmup_steps=-3", "--config.max_grad_norm=-1"],
        [
            "3 config values are not allowed",
            "learning_rate=-1.0 is not allowed; it must be a finite number >= 0.0",
            "warmup_steps=-3 is not allowed; it must be an integer >= 0",
            "max_grad_norm=-1.0 is not allowed; it must be a finite number >= 0.0",
        ],
    ),
    "nan_learning_rate": (
        INVALID,
        ["--config.learning_rate=nan"],
        ["learning_rate=nan is not allowed"],
    ),
    "inf_learning_rate": (
        INVALID,
        ["--config.learning_rate=inf"],
        ["learning_rate=inf is not allowed"],
    ),
    "batch_beyond_host_memory": (
        INVALID,
        ["--config.batch_size=1000000000000"],
        ["batch_size=1000000000000 with seq_len=32 needs", "use a batch_size of at most"],
    ),
}


@pytest.mark.parametrize("case", sorted(MAIN_CASES))
def test_bad_flags_and_values_are_one_line_and_touch_nothing(corpus, unchanged, case):
    status, extra, fragments = MAIN_CASES[case]
    args = rh.main_command(config_of(corpus), unchanged)[2:] + extra
    assert_one_line_error(run_command(args), status, *fragments)


def test_a_workdir_that_is_a_file_is_one_line(corpus, unchanged):
    target = unchanged / "metrics.jsonl"
    result = run_command(rh.main_command(config_of(corpus), target)[2:])
    assert_one_line_error(result, INVALID, f"workdir='{target}' is a file; give a directory")


def test_an_unwritable_checkpoint_directory_exits_at_once(corpus, earlier_run, tmp_path):
    """`checkpoints` is a regular file (chmod cannot stop root): one line, before Orbax
    starts the threads that would report it again and keep the process alive."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "checkpoints").write_text("not a directory")
    vocab = earlier_run[0] / tokenizer_lib.MODEL_FILENAME
    config = config_of(corpus, vocab_path=str(vocab))
    result = run_command(rh.main_command(config, workdir)[2:], timeout=180)
    checkpoints = workdir / "checkpoints"
    assert_one_line_error(
        result, INVALID, f"cannot keep checkpoints in {checkpoints}", "is a file, not a directory"
    )
    assert not (workdir / workdir_lease.LEASE_FILENAME).exists()


COMPILE_CASES = {
    "unknown_topology": (["--topology=v9z-8"], ["topology='v9z-8' is not allowed"]),
    "bad_num_slices": (["--topology=v5p-8", "--num_slices=0"], ["num_slices=0 is not allowed"]),
    "unknown_config_key": (
        ["--topology=v5p-8", "--config.model.num_layer=2"],
        ["config.model has no key 'num_layer'"],
    ),
}


@pytest.mark.parametrize("case", sorted(COMPILE_CASES))
def test_compile_bad_flags_are_one_line(case):
    extra, fragments = COMPILE_CASES[case]
    result = run_command(["maelm_jax.compile", "--config=configs/default.py", *extra])
    assert_one_line_error(result, 2, *fragments, prog="maelm_jax.compile")


BENCH_CASES = {
    "unknown_command": (
        ["fly"],
        [
            "no benchmark 'fly'",
            "usage: python -m maelm_jax.bench {speed|checkpoint|input|kernels|finetune}",
        ],
    ),
    # The configs it could have named, runnable ones only (configs/modern.py is a helper).
    "unknown_config": (
        ["speed", "--configs=nope"],
        ["--configs names a config that is not in", "configs there: base, default, mae_lm_base,"],
    ),
    "missing_config_file": (
        ["speed", "--configs=default,my_configs/nope.py"],
        ["--configs names a config that is not in", "nor a .py file that exists"],
    ),
    # --steps=0 and --seq_len=1 are refused by the same flag bounds.
    "negative_batch": (["speed", "--batch_size=-8"], ["--batch_size=-8", "not a positive integer"]),
}


@pytest.mark.parametrize("case", sorted(BENCH_CASES))
def test_bench_bad_flags_are_one_line(case):
    extra, fragments = BENCH_CASES[case]
    result = run_command(["maelm_jax.bench", *extra])
    assert_one_line_error(result, 2, *fragments, prog="maelm_jax.bench")


def _one_huge_line(root):
    """A file whose one line (no newline at all) is just over the document limit."""
    (root / "huge.txt").write_text("word " * (documents.MAX_DOCUMENT_CHARS // 5 + 1))
    return root / "huge.txt", "line 1 alone is longer than 8,388,608 characters"


def _only_whitespace(root):
    (root / "empty.txt").write_text("")
    (root / "blank.txt").write_text("  \n\n\t\n")
    return f"dataset='text:{root}/*.txt'", "its 2 file(s) hold only whitespace or nothing"


@pytest.mark.parametrize("make", [_one_huge_line, _only_whitespace], ids=lambda f: f.__name__)
def test_text_files_that_hold_no_usable_documents_are_one_line(unchanged, tmp_path, make):
    """Aimed at the earlier run's workdir, whose tokenizer is loaded: the files are read
    when the data is packed, and refused before anything is cached or trained."""
    named, problem = make(tmp_path)
    result = run_command(rh.main_command(config_of(f"text:{tmp_path}/*.txt"), unchanged)[2:])
    assert_one_line_error(result, INVALID, f"error: {named}", problem, documents.TEXT_FILES_NEEDED)


# --- Input files, in-process: the ConfigError is the one line `main` prints (above) --------


def test_a_text_file_that_is_not_utf8_is_named_with_its_line_and_byte(tmp_path):
    (tmp_path / "a.txt").write_text("Plain text.\n\nMore plain text.\n")
    (tmp_path / "b.txt").write_bytes("Fine line.\nCaf\u00e9 in Latin-1.\n".encode("latin-1"))
    config = configdict.freeze(config_of(f"text:{tmp_path}/*.txt")).data
    with pytest.raises(ConfigError) as error:
        list(documents.read_documents(config, "train", 0, 1))
    assert str(error.value).startswith(
        f"{tmp_path / 'b.txt'}: line 2 is not UTF-8 (invalid continuation byte: byte 0xe9 at "
        "column 4); text files must be UTF-8"
    )


def test_one_enormous_line_is_cut_into_pieces_the_trainer_accepts():
    words = " ".join(f"word{i % 500}" for i in range(20_000))  # ~170k characters, one line
    assert len(words) > 5 * tokenizer_lib._MAX_SENTENCE_CHARS
    pieces = list(tokenizer_lib._sentences([words]))
    assert "".join(pieces) == words
    assert all(len(p) <= tokenizer_lib._MAX_SENTENCE_CHARS for p in pieces)
    assert all(p.endswith(" ") for p in pieces[:-1])  # cut after a space, never in a word
    model = tokenizer_lib.Tokenizer(tokenizer_lib.train([words], 300))
    assert model.decode(model.encode("word7 word8")) == "word7 word8"


@pytest.mark.parametrize("kind", ["a directory", "an empty file"])
def test_a_vocab_path_that_is_no_model_file_is_one_line(tmp_path, kind):
    path = tmp_path / "vocab"
    path.mkdir() if kind == "a directory" else path.write_bytes(b"")
    config = configdict.freeze(config_of("text:/unused/*.txt", vocab_path=str(path))).data
    with pytest.raises(ConfigError, match=f"vocab_path='{path}' is {kind}; give a SentencePiece"):
        load_tokenizer(config, tmp_path / "run")
