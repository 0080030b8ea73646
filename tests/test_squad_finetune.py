"""SQuAD through the fine-tuning search and `python -m maelm_jax.finetune` (`finetuning/`).

A synthetic task in the official layout proves that labels, offsets and decoding line up: each
context is filler words from a small vocabulary with at most one digit in it; the question
names a digit, and the answer is the word right after it. Where the named digit is absent from
the context, the question has no answer (SQuAD 2.0's `is_impossible`). The words are several
tokens each in the export's tokenizer, so a start or end label one token off cuts another text
and scores 0 EM; a tiny encoder with the relative bias learns the task from random init in
under a minute of CPU.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from process_runs import process_env
from text_corpora import write_corpus
from tiny_configs import REPO_ROOT, tiny_run_config

from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import recipe, search
from maelm_jax.finetuning.squad_runs import SquadTask
from maelm_jax.hf import export
from maelm_jax.squad import reading, scoring

torch.set_num_threads(1)

FILLERS = (
    "red", "blue", "green", "stone", "river", "cloud", "lamp", "tree", "fish", "bird", "road",
    "song", "king", "moon",
)  # fmt: skip
DIGITS = tuple("12345678")
LEARN = recipe.Recipe(
    learning_rates=(1e-3,), batch_sizes=(32,), seeds=(1,), epochs=15.0, warmup_ratio=0.1,
    weight_decay=0.01, dropout=0.0, attention_dropout=0.0,
)  # fmt: skip


def synthetic(n: int, seed: int) -> dict:
    """An official-format file: two thirds answerable ("after 6" -> the word after the 6),
    one third naming a digit the context does not hold."""
    rng = np.random.default_rng(seed)
    data = []
    for c in range(n):
        words = [str(w) for w in rng.choice(FILLERS, rng.integers(6, 11))]
        digit = str(rng.choice(DIGITS))
        qa = {"id": f"q{seed}-{c}", "question": f"after {digit}", "answers": []}
        if c % 3 < 2:
            spot = int(rng.integers(0, len(words) - 1))
            words[spot] = digit
            start = len(" ".join(words[: spot + 1])) + 1
            qa["answers"] = [{"text": words[spot + 1], "answer_start": start}]
        qa["is_impossible"] = not qa["answers"]
        data.append({"title": f"t{c}", "paragraphs": [{"context": " ".join(words), "qas": [qa]}]})
    return {"version": "v2.0", "data": data}


def write_squad(root, version="2.0", n_train=1500, n_dev=300):
    root.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("dev", n_dev, 1)):
        document = synthetic(n, seed)
        if version == "1.1":  # 1.1 has no unanswerable questions
            for article in document["data"]:
                for p in article["paragraphs"]:
                    p["qas"] = [q for q in p["qas"] if q["answers"]]
                    for q in p["qas"]:
                        del q["is_impossible"]
            document["data"] = [a for a in document["data"] if a["paragraphs"][0]["qas"]]
        (root / f"{split}-v{version}.json").write_text(json.dumps(document))
    return root


def write_sst2(root, n=128):
    """SST-2 in GLUE's layout, label 1 iff the sentence opens with "lamp"."""
    (root / "SST-2").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split in ("train", "dev"):
        rows = []
        for i in range(n):
            words = [str(w) for w in rng.choice(FILLERS[:6], 5)]
            rows.append(f"{'lamp ' if i % 2 else ''}{' '.join(words)} .\t{i % 2}\n")
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(rows))
    return root


@pytest.fixture(scope="module")
def squad_export(tmp_path_factory):
    """A tiny relative-bias export (remote-code MaelmForQuestionAnswering) with 128 positions,
    its tokenizer trained on the task's words: only its architecture matters from random init."""
    root = tmp_path_factory.mktemp("squad_export")
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(FILLERS + DIGITS, 12)) + " ." for _ in range(300)]
    config = tiny_run_config(
        write_corpus(root / "corpus", docs),
        num_train_steps=2, warmup_steps=1, checkpoint_every_steps=2, eval_batches=0,
        **{
            "model.max_positions": 128, "model.relative_attention_buckets": 16,
            "model.relative_attention_max_distance": 16, "model.scan_layers": False,
            "model.hidden_size": 64, "model.mlp_dim": 128,
        },
    )  # fmt: skip
    from maelm_jax.config import configdict
    from maelm_jax.training import train

    train.train_and_evaluate(configdict.freeze(config), root / "run")
    return str(export.export(root / "run", root / "export").output_dir)


def official_eval(run_dir, dev_file, with_null=True) -> dict:
    """The official rules applied to the run's own predictions.json (and null_odds.json)."""
    examples = {e.id: e for e in reading.read_squad_file(dev_file)}
    predictions = json.loads((run_dir / "predictions.json").read_text())
    kept = [examples[i] for i in predictions]
    if not with_null:
        return scoring.evaluate_v1(kept, predictions)
    null_odds = json.loads((run_dir / "null_odds.json").read_text())
    return scoring.evaluate_v2(kept, predictions, null_odds)


def test_a_tiny_model_learns_the_synthetic_task_from_random_init(squad_export, tmp_path):
    squad_dir = write_squad(tmp_path / "squad")
    task = SquadTask(reading.VERSIONS["squad_v2"], LEARN, squad_dir=str(squad_dir))
    out = tmp_path / "out"
    result = search.run_search(squad_export, [task], recipe.QUICK, str(out), inits=("random",))
    (summary,) = result["tasks"]
    run_dir = out / "runs" / "squad_v2-random-lr0.001-bs32-seed1"
    written = json.loads((run_dir / "eval.json").read_text())
    assert written == official_eval(run_dir, squad_dir / "dev-v2.0.json")
    assert summary["family"] == "squad" and result["glue_score"] == {}
    assert summary["median"] == pytest.approx(written["f1"])
    assert summary["metric_medians"]["dev"]["exact"] == pytest.approx(written["exact"])
    assert written["total"] == 300 and written["NoAns_total"] == 100
    assert written["exact"] >= 90, written  # an off-by-one label or cut scores near 67 or 33


def test_quick_cli_runs_squad_beside_glue_outside_the_glue_average(squad_export, tmp_path):
    squad_dir = write_squad(tmp_path / "squad", n_train=300, n_dev=300)
    glue_dir = write_sst2(tmp_path / "glue")
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "maelm_jax.finetune", f"--export={squad_export}",
        f"--output_dir={out}", "--tasks=sst2,squad_v2", f"--squad_dir={squad_dir}",
        f"--glue_dir={glue_dir}", "--quick", "--max_steps=30",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=process_env(), cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "windows of 128 tokens" in done.stderr  # the export's length, said once
    run_dir = out / "runs" / "squad_v2-pretrained-lr0.0001-bs16-seed1"
    predictions = json.loads((run_dir / "predictions.json").read_text())
    dev = reading.read_squad_file(squad_dir / "dev-v2.0.json")
    assert list(predictions) == [e.id for e in dev[:200]]  # --quick's 200, every one predicted
    assert set(json.loads((run_dir / "null_odds.json").read_text())) == set(predictions)
    written = json.loads((run_dir / "eval.json").read_text())
    assert written == official_eval(run_dir, squad_dir / "dev-v2.0.json")
    result = json.loads((out / "results.json").read_text())
    sst2 = next(t for t in result["tasks"] if t["task"] == "sst2")
    assert result["glue_score"] == {"pretrained": pytest.approx(sst2["median"])}
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert f"EM {written['exact']:.1f}" in rows["squad_v2"]
    assert f"F1 {written['f1']:.1f}" in rows["squad_v2"]
    assert f"1 task(s)): {sst2['median']:.1f}" in rows["GLUE"]  # sst2 alone


def test_squad_1_1_scores_em_and_f1_of_every_question(squad_export, tmp_path):
    squad_dir = write_squad(tmp_path / "squad", version="1.1", n_train=64, n_dev=60)
    quick = recipe.Recipe(**{**vars(recipe.SQUAD_QUICK), "max_steps": 5})
    task = SquadTask(reading.VERSIONS["squad_v1"], quick, squad_dir=str(squad_dir))
    out = tmp_path / "out"
    result = search.run_search(squad_export, [task], recipe.QUICK, str(out))
    run_dir = out / "runs" / "squad_v1-pretrained-lr0.0001-bs16-seed1"
    written = json.loads((run_dir / "eval.json").read_text())
    assert written == official_eval(run_dir, squad_dir / "dev-v1.1.json", with_null=False)
    assert set(written) == {"exact_match", "f1"} and not (run_dir / "null_odds.json").exists()
    assert len(json.loads((run_dir / "predictions.json").read_text())) == 40
    assert result["tasks"][0]["metric_medians"]["dev"]["exact"] == pytest.approx(
        written["exact_match"]
    )


@pytest.mark.parametrize(
    "case, said",
    [
        ("no folder", "does not exist or is not a folder"),
        ("no dev split", "dev-v2.0.json: no such file"),
        ("not JSON", "not a JSON file"),
        ("no data", "has no `data` list"),
    ],
)
def test_bad_squad_input_is_refused_before_anything_is_written(squad_export, tmp_path, case, said):
    squad_dir = write_squad(tmp_path / "squad", n_train=9, n_dev=9)
    if case == "no folder":
        squad_dir = tmp_path / "nowhere"
    elif case == "no dev split":
        (squad_dir / "dev-v2.0.json").unlink()
    elif case == "not JSON":
        (squad_dir / "train-v2.0.json").write_text("<html>not found</html>")
    else:
        (squad_dir / "dev-v2.0.json").write_text('{"version": "v2.0"}')
    task = SquadTask(reading.VERSIONS["squad_v2"], recipe.SQUAD_QUICK, squad_dir=str(squad_dir))
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=said) as raised:
        search.run_search(squad_export, [task], recipe.QUICK, str(out))
    assert "\n" not in str(raised.value)
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--tasks=squad_v2", "--squad_dir=NOWHERE"], "NOWHERE' does not exist or is not a"),
        (["--tasks=sst2,squad_v9"], "unknown task 'squad_v9'; allowed: cola,"),
    ],
)
def test_the_command_says_bad_squad_input_in_one_line(squad_export, tmp_path, flags, said):
    command = [
        sys.executable, "-m", "maelm_jax.finetune", f"--export={squad_export}",
        f"--output_dir={tmp_path / 'out'}",
        *[f.replace("NOWHERE", str(tmp_path / "nowhere")) for f in flags],
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=process_env(), cwd=REPO_ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("maelm_jax.finetune: error: ") and "Traceback" not in done.stderr
    assert said.replace("NOWHERE", str(tmp_path / "nowhere")) in last
    assert not (tmp_path / "out").exists()
