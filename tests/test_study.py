"""`python -m maelm_jax.study` on a micro budget: two objectives and the random-init row
through every stage, pretrained on the study's own corpus (the task's train text), killed
after its first stage and finished by a rerun that redoes nothing finished, then refused
when the config changes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from process_runs import TPU_INIT_ERRORS, free_port, process_env, users_machine
from test_glue_data import STSB_HEADER, write_glue
from text_corpora import sample_document
from tiny_configs import REPO_ROOT, tiny_config

from maelm_jax.config import configdict
from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError
from maelm_jax.data import documents, preparation
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.glue.tasks import TASKS
from maelm_jax.studies import plan, task_text

CONFIG = """from configs import default


def get_config():
    c = default.get_config()
    c.objective = {objective!r}
    c.mask_rate = 0.25
    c.dataset = "study:task_text"
    c.vocab_size, c.tokenizer_train_documents, c.eval_holdout_fraction = 300, 1000, 0.1
    c.seq_len, c.batch_size, c.num_train_steps, c.warmup_steps = 32, 8, 6, 1
    c.eval_every_steps, c.eval_batches, c.log_every_steps, c.checkpoint_every_steps = 6, 1, 3, 6
    m = c.model
    m.num_layers, m.hidden_size, m.num_heads, m.mlp_dim, m.max_positions = 2, 32, 4, 64, 32
    m.relative_attention_buckets, m.relative_attention_max_distance = 16, 32
    m.decoder_relative_attention = {objective!r} != "mlm"
    return c
"""


def _study(args, wait=True, cwd=REPO_ROOT, command=None):
    """The study on one process as a user runs it: JAX picks its backend (no JAX_PLATFORMS),
    on a machine that ships mpi4py as NVIDIA's containers do. `command`: what runs it in
    place of `python -m maelm_jax.study`, the same flags following."""
    env = users_machine({**process_env(1), "OMP_NUM_THREADS": "1"})
    proc = subprocess.Popen(
        [*(command or [sys.executable, "-m", "maelm_jax.study"]), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if not wait:
        return proc
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def _sst2(root, train: list[str], dev: list[str]):
    """SST-2 in GLUE's layout; the label alternates (the study asserts no score here)."""
    for split, texts in (("train", train), ("dev", dev)):
        rows = [f"{t} \t{i % 2}" for i, t in enumerate(texts)]
        write_glue(root, "SST-2", split, ["sentence\tlabel", *rows])
    return root


def _one_line(i: int) -> str:
    return " ".join(sample_document(i).split())


def test_the_corpus_holds_each_train_example_once_pairs_together_and_no_dev_text(tmp_path):
    train = [_one_line(i) for i in range(6)]
    glue = _sst2(tmp_path / "glue", [*train, train[2]], dev=["a dev sentence never seen ."])
    stsb = [f"{i}\tg\tf\ty\t{i}\ts\ts\tfirst {i} .\tsecond {i} .\t{i}.0" for i in range(3)]
    write_glue(glue, "STS-B", "train", [STSB_HEADER, *stsb])
    write_glue(glue, "STS-B", "dev", [STSB_HEADER, "9\tg\tf\ty\t9\ts\ts\tdev a\tdev b\t1.0"])

    info = task_text.write([TASKS["sst2"], TASKS["stsb"]], glue, str(tmp_path / "study"))

    path = tmp_path / "study" / task_text.CORPUS_DIR / task_text.CORPUS_FILE
    docs = path.read_text().split("\n\n")
    assert docs[-1] == ""  # every document ends with its blank line
    assert docs[:-1] == [*train, *(f"first {i} .\nsecond {i} ." for i in range(3))]
    assert info["documents"] == 9 and info["documents_per_task"] == {"sst2": 6, "stsb": 3}
    assert "dev" not in path.read_text() and "\t" not in path.read_text()
    assert task_text.dataset(str(tmp_path / "study")) == f"text:{path}"


def _squad_file(path, contexts: list[tuple[str, list[str]]]):
    """An official-format SQuAD 2.0 file: each context with its questions (no answers: the
    corpus reads no answer)."""
    data = [
        {"title": f"t{c}", "paragraphs": [{"context": context, "qas": [
            {"id": f"{path.stem}-{c}-{q}", "question": question, "answers": [],
             "is_impossible": True}
            for q, question in enumerate(questions)
        ]}]}
        for c, (context, questions) in enumerate(contexts)
    ]  # fmt: skip
    path.write_text(json.dumps({"version": "v2.0", "data": data}))


def test_the_corpus_holds_each_squad_context_once_with_its_questions_and_no_dev_text(tmp_path):
    train = [_one_line(i) for i in range(3)]
    glue = _sst2(tmp_path / "glue", train, dev=["a dev sentence never seen ."])
    squad = tmp_path / "squad"
    squad.mkdir()
    # A context asked twice, in two paragraphs (the official files repeat them): written once.
    _squad_file(
        squad / "train-v2.0.json",
        [
            ("the  first context .", ["who ?", "what ?"]),
            ("a second context .", ["where ?"]),
            ("the first context .", ["when ?"]),
        ],
    )
    _squad_file(squad / "dev-v2.0.json", [("dev context never seen .", ["dev question ?"])])
    tasks = plan.resolve_tasks("sst2,squad_v2", Recipe(), str(squad))

    info = task_text.write(tasks, glue, str(tmp_path / "study"))

    path = tmp_path / "study" / task_text.CORPUS_DIR / task_text.CORPUS_FILE
    docs = path.read_text().split("\n\n")
    squad_docs = [
        "the first context .\nwho ?\nwhat ?\nwhen ?",
        "a second context .\nwhere ?",
    ]
    assert docs[:-1] == [*train, *squad_docs]
    assert info["documents_per_task"] == {"sst2": 3, "squad_v2": 2}
    assert "dev" not in path.read_text()


def test_a_study_records_its_squad_data_and_refuses_a_changed_one_by_name(tmp_path):
    recipe = Recipe(learning_rates=(1e-3,), seeds=(1, 2), max_steps=100)
    squad_dir = tmp_path / "squad"
    (squad_task,) = plan.resolve_tasks("squad_v2", recipe, str(squad_dir))
    # SQuAD's recipe under the study's grid and budget
    assert squad_task.recipe.learning_rates == (1e-3,) and squad_task.recipe.seeds == (1, 2)
    assert squad_task.recipe.max_steps == 100 and squad_task.recipe.warmup_ratio == 0.1

    def study(squad):
        tasks = plan.resolve_tasks("sst2,squad_v2", recipe, squad)
        return plan.Study(_configs(), tasks, recipe, None, 64, squad_dir=squad)

    plan.claim(str(tmp_path / "study"), study(str(squad_dir)))
    spec = json.loads((tmp_path / "study" / plan.SPEC_FILE).read_text())
    assert spec["squad_data"] == str(squad_dir) and spec["tasks"] == ["sst2", "squad_v2"]
    with pytest.raises(ConfigError) as e:
        plan.claim(str(tmp_path / "study"), study(None))
    assert f"another squad_data (was {str(squad_dir)!r})" in str(e.value)
    with pytest.raises(ConfigError, match=r"--squad_dir=D goes with --tasks=\.\.\.,squad_v2 or"):
        plan.resolve_tasks("sst2", recipe, "D")
    with pytest.raises(ConfigError, match="unknown task 'squad_v9'; allowed: cola, "):
        plan.resolve_tasks("sst2,squad_v9", recipe, None)
    assert "squad_data" not in plan.Study(_configs(), (TASKS["sst2"],), recipe, None, 64).spec()


def test_a_study_with_squad_fine_tunes_it_and_refuses_bad_squad_data_before_pretraining(
    tmp_path,
):
    """One objective on the SQuAD corpus, two fine-tuning steps a row: the wiring, not a score."""
    from test_squad_finetune import write_squad

    config = tmp_path / "mlm.py"
    config.write_text(CONFIG.format(objective="mlm"))
    squad = write_squad(tmp_path / "squad", n_train=240, n_dev=12)
    args = [
        f"--configs={config}", "--tasks=squad_v2", "--seeds=1", "--max_steps=2",
        "--rank_tokens=64",
    ]  # fmt: skip
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train-v2.0.json").write_text("<html>not found</html>")
    (bad / "dev-v2.0.json").write_text("{}")
    rc, _, err = _study([f"--study_dir={tmp_path / 'refused'}", f"--squad_dir={bad}", *args])
    assert rc == 1 and "train-v2.0.json" in err.strip().splitlines()[-1], err[-2000:]
    assert not (tmp_path / "refused").exists()  # refused before anything, pretraining first
    # 32 positions hold no window of a 64-token question: said before pretraining too
    rc, _, err = _study([f"--study_dir={tmp_path / 'refused'}", f"--squad_dir={squad}", *args])
    last = err.strip().splitlines()[-1]
    assert rc == 1 and "mlm has model.max_positions=32; SQuAD's windows need at least" in last
    assert not (tmp_path / "refused").exists()
    args.append("--overrides=model.max_positions=96")

    study_dir = tmp_path / "study"
    rc, out, err = _study([f"--study_dir={study_dir}", f"--squad_dir={squad}", *args])
    assert rc == 0, err[-3000:]
    corpus = (study_dir / task_text.CORPUS_DIR / task_text.CORPUS_FILE).read_text()
    assert "after" in corpus and "q1-" not in corpus  # the questions, no dev id
    results = json.loads((study_dir / "results.json").read_text())
    for row in results["table"]:
        assert row["GLUE avg"] is None and 0 <= row["squad_v2 F1"] <= 100, row
    predicted = study_dir / "random_init" / "finetune" / "runs"
    assert len(json.loads(next(predicted.glob("*/predictions.json")).read_text())) == 12
    assert "| squad_v2 EM | squad_v2 F1 |" in out


def test_only_the_study_reads_its_corpus_and_compiling_its_configs_still_works(tmp_path):
    config = tiny_config("mae_lm")
    config.dataset = STUDY_TASK_TEXT
    run = configdict.freeze(config)  # compile, flops and export read no data
    for read in (
        lambda: preparation.prepare_source(run.data, None, download=False),
        lambda: documents.read_documents(run.data, "train", 0, 1),
    ):
        with pytest.raises(ConfigError) as e:
            read()
        assert f"dataset={STUDY_TASK_TEXT!r} is a study's own corpus" in str(e.value)
        assert "python -m maelm_jax.study" in str(e.value) and "\n" not in str(e.value)


def test_study_runs_every_stage_resumes_after_a_kill_and_refuses_a_changed_config(tmp_path):
    configs = []
    for name in ("mlm", "mae_lm"):
        path = tmp_path / f"{name}.py"
        path.write_text(CONFIG.format(objective=name))
        configs.append(str(path))
    train = [_one_line(i) for i in range(240)]
    glue = _sst2(tmp_path / "glue", train, dev=[_one_line(i) for i in range(240, 256)])
    study_dir = tmp_path / "study"
    args = [
        f"--study_dir={study_dir}", f"--configs={','.join(configs)}", "--tasks=sst2",
        f"--glue_dir={glue}", "--seeds=1,2", "--max_steps=4", "--rank_tokens=64",
    ]  # fmt: skip

    proc = _study(args, wait=False)
    first = study_dir / "mlm" / "pretrain.json"
    deadline = time.monotonic() + 400
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert first.exists(), "the first stage never finished"
    assert not (study_dir / "results.json").exists()

    # Had mlm been pretrained on 2 processes (a pod), mae_lm may not follow on 1: the
    # process count is part of the data order. Refused before anything is written.
    marker = first.read_text()
    assert json.loads(marker)["processes"] == 1
    first.write_text(json.dumps({**json.loads(marker), "processes": 2}))
    files = {p: p.stat().st_mtime_ns for p in study_dir.rglob("*")}
    rc, _, err = _study(args)
    assert rc == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "mlm was pretrained on 2 process(es) and this run has 1; mae_lm must" in last, last
    assert {p: p.stat().st_mtime_ns for p in study_dir.rglob("*")} == files
    first.write_text(marker)
    stamp = first.stat().st_mtime_ns

    rc, out, err = _study(args)
    assert rc == 0, err[-3000:]
    assert first.stat().st_mtime_ns == stamp  # done once, not redone
    assert "mlm/pretrain already done" in err
    # JAX let go of its devices after pretraining (on a GPU: PyTorch's memory to fine-tune
    # in), and no absent TPU was announced
    assert "JAX released its ['cpu'] devices" in err, err[-3000:]
    assert not [e for e in TPU_INIT_ERRORS if e in err], err[:3000]
    corpus = study_dir / task_text.CORPUS_DIR / task_text.CORPUS_FILE
    assert corpus.read_text().split("\n\n")[:-1] == train  # the train text, no dev row
    for row in ("mlm", "mae_lm"):
        saved = study_dir / row / "workdir" / "checkpoints" / "6" / "config" / "metadata"
        assert json.loads(saved.read_text())["dataset"] == f"text:{corpus}"
        for stage in ("pretrain", "export", "finetune", "rank"):
            assert (study_dir / row / f"{stage}.json").is_file(), (row, stage)
    with open(study_dir / "results.json") as f:
        results = json.load(f)
    table = {r["row"]: r for r in results["table"]}
    assert list(table) == ["mlm", "mae_lm", "random_init"]
    assert table["random_init"]["pretraining FLOPs"] == 0
    # MAE-LM's encoder runs on 75% of the tokens, plus a decoder and the same head
    assert 0 < table["mae_lm"]["pretraining FLOPs"] != table["mlm"]["pretraining FLOPs"]
    for r in table.values():
        assert 0 <= r["sst2"] <= 100 and r["GLUE avg"] == r["sst2"]
    assert table["mlm"]["params (encoder)"] == table["mae_lm"]["params (encoder)"]
    assert table["mlm"]["last-layer rank"] > 1
    assert "| random_init |" in out and (study_dir / "study.png").stat().st_size > 0
    results_stamp = (study_dir / "results.json").stat().st_mtime_ns

    rc, _, err = _study([*args, "--overrides=num_train_steps=7"])
    assert rc != 0
    last = err.strip().splitlines()[-1]
    assert "another config 'mlm' (num_train_steps changed)" in last, last
    assert (study_dir / "results.json").stat().st_mtime_ns == results_stamp
    assert os.listdir(study_dir / "mlm" / "workdir" / "checkpoints") == ["6"]


def test_a_remote_study_dir_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    """`gs://` would have become a local folder named `gs:`, one per host."""
    rc, out, err = _study(["--study_dir=gs://bucket/study"], cwd=tmp_path)
    assert rc != 0
    (line,) = [x for x in err.splitlines() if "maelm_jax.study: error" in x]
    assert "--study_dir=gs://bucket/study: a study lives in a local folder" in line, line
    assert "gcsfuse" in line and out == ""
    assert os.listdir(tmp_path) == []


def _on_processes(args_of: list[list[str]], timeout: float = 500) -> list[tuple[int, str, str]]:
    """One study process per entry of `args_of`, joined on localhost with gloo like a pod's
    hosts; (returncode, stdout, stderr) of each, every one killed past `timeout`."""
    joined = [f"--coordinator_address=localhost:{free_port()}", f"--num_processes={len(args_of)}"]
    procs = [
        _study([*args, *joined, f"--process_id={i}"], wait=False) for i, args in enumerate(args_of)
    ]
    deadline, results = time.monotonic() + timeout, []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def test_on_two_processes_both_pretrain_and_process_0_alone_does_the_rest(tmp_path):
    """A pod's study: every host pretrains in one `jax.distributed` job, process 0 exports
    (in a runtime of its own), fine-tunes, measures and prints the table."""
    config = tmp_path / "mlm.py"
    config.write_text(CONFIG.format(objective="mlm"))
    glue = _sst2(tmp_path / "glue", [_one_line(i) for i in range(120)], dev=["a dev one ."] * 8)
    study_dir, workdirs = tmp_path / "study", tmp_path / "bucket"  # a gs:// bucket on a pod
    args = [
        f"--study_dir={study_dir}", f"--configs={config}", "--tasks=sst2", f"--glue_dir={glue}",
        "--seeds=1", "--max_steps=2", "--rank_tokens=64", f"--workdir_root={workdirs}",
    ]  # fmt: skip

    (rc0, out0, err0), (rc1, out1, err1) = _on_processes([args, args])

    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    assert "over 2 processes" in err0  # one mesh of both processes' devices
    assert "every objective is pretrained; process 0 does the rest" in err1
    assert "| random_init |" in out0 and "|" not in out1  # (gloo prints to stdout)
    for stage in ("pretrain", "export", "finetune", "rank"):
        assert (study_dir / "mlm" / f"{stage}.json").is_file(), stage
    assert json.loads((study_dir / "mlm" / "pretrain.json").read_text())["processes"] == 2
    with open(study_dir / "results.json") as f:
        table = {r["row"]: r for r in json.load(f)["table"]}
    assert list(table) == ["mlm", "random_init"]
    assert table["mlm"]["last-layer rank"] > 1 and table["mlm"]["final eval loss"] > 0
    assert os.listdir(workdirs / "mlm" / "checkpoints") == ["6"]
    assert not (study_dir / "mlm" / "workdir").exists()


def test_on_two_processes_a_failed_pretraining_stops_both_with_its_line_and_no_marker(tmp_path):
    """A NaN at step 2 fails training on both processes at once: each leaves the stage
    through the barrier and the job's shutdown (no host left waiting in a collective) and
    exits 1 with the training path's own line."""
    config = tmp_path / "mlm.py"
    config.write_text(CONFIG.format(objective="mlm"))
    glue = _sst2(tmp_path / "glue", [_one_line(i) for i in range(120)], dev=["a dev one ."] * 2)
    study_dir = tmp_path / "study"
    args = [
        f"--study_dir={study_dir}", f"--configs={config}", "--tasks=sst2", f"--glue_dir={glue}",
        "--seeds=1", "--overrides=inject_nan_at_step=2",
    ]  # fmt: skip

    results = _on_processes([args, args], timeout=300)

    lines = [err.strip().splitlines()[-1] for _, _, err in results]
    assert [rc for rc, _, _ in results] == [1, 1], lines
    assert all("non-finite loss or gradient at step 2" in line for line in lines), lines
    assert not (study_dir / "mlm" / "pretrain.json").exists()


def test_workdir_root_is_a_local_folder_or_a_gs_url():
    assert plan.workdir_root(None) is None
    assert plan.workdir_root("runs") == os.path.abspath("runs")
    assert plan.workdir_root("gs://bucket/study/") == "gs://bucket/study"
    with pytest.raises(ConfigError) as e:
        plan.workdir_root("s3://bucket/study")
    assert str(e.value) == "--workdir_root=s3://bucket/study: give a local folder or a gs:// URL"


def test_on_two_processes_a_folder_one_host_cannot_see_is_refused_before_pretraining(
    tmp_path,
):
    """Process 1 given another folder stands for a host without the shared mount."""
    config = tmp_path / "mlm.py"
    config.write_text(CONFIG.format(objective="mlm"))
    glue = _sst2(tmp_path / "glue", [_one_line(i) for i in range(8)], dev=["a dev one ."] * 2)
    args = [f"--configs={config}", "--tasks=sst2", f"--glue_dir={glue}", "--seeds=1"]

    results = _on_processes(
        [[f"--study_dir={tmp_path / 'study'}", *args], [f"--study_dir={tmp_path / 'b'}", *args]]
    )

    lines = [err.strip().splitlines()[-1] for _, _, err in results]
    assert [rc for rc, _, _ in results] == [1, 1], lines
    assert "process 1 does not see the spec.json that process 0 wrote" in lines[1], lines
    assert "NFS" in lines[1] and "process(es) [1] failed" in lines[0], lines
    assert not (tmp_path / "study" / "mlm").exists()  # nothing pretrained


def _configs(**changes) -> dict:
    configs = {"mlm": tiny_config("mlm"), "mae_lm": tiny_config("mae_lm")}
    for key, value in changes.items():
        configs["mae_lm"][key] = value
    return configs


@pytest.mark.parametrize(
    "configs,overrides,named",
    [
        (
            lambda: {"random_init": tiny_config("mlm")},
            {},
            "'random_init' names the random-init row's folder; rename the file",
        ),
        (
            lambda: _configs(batch_size=16),
            {},
            "mae_lm and mlm differ in batch_size; a study's objectives share one corpus",
        ),
        (lambda: _configs(), {"model.no_such_key": "1"}, "--overrides model.no_such_key: the"),
        (
            lambda: _configs(),
            {"num_train_steps": "'ten'"},
            "--overrides num_train_steps='ten': takes a int (now ",
        ),
    ],
    ids=["reserved_name", "shared_key_differs", "unknown_override", "override_of_another_type"],
)
def test_configs_a_study_cannot_compare_are_refused_by_name(configs, overrides, named):
    with pytest.raises(ConfigError) as e:
        plan.with_overrides(configs(), overrides)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_folder_of_other_files_is_not_taken_for_a_study(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    study = plan.Study(
        configs=_configs(),
        tasks=(TASKS["sst2"],),
        recipe=Recipe(),
        glue_dir=None,
        rank_tokens=64,
    )
    with pytest.raises(ConfigError) as e:
        plan.claim(str(tmp_path), study)
    assert f"--study_dir={tmp_path} exists, is not empty and holds no spec.json" in str(e.value)
    assert os.listdir(tmp_path) == ["notes.txt"]
