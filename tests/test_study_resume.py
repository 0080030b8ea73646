"""A study resumed from a copy of its folder that holds only what is small (the spec, the
markers, the fine-tuning searches): it pretrains and exports again only what an unfinished
stage needs, says why, and keeps every finished fine-tuning run."""

import json
import shutil

from test_study import CONFIG, _one_line, _sst2, _study


def _mtimes(paths) -> dict:
    return {p: p.stat().st_mtime_ns for p in paths}


def test_a_copy_without_checkpoints_and_exports_redoes_only_what_is_needed(tmp_path):
    config = tmp_path / "mlm.py"
    config.write_text(CONFIG.format(objective="mlm"))
    glue = _sst2(tmp_path / "glue", [_one_line(i) for i in range(120)], dev=["a dev one ."] * 8)
    study_dir = tmp_path / "study"
    args = [
        f"--study_dir={study_dir}", f"--configs={config}", "--tasks=sst2", f"--glue_dir={glue}",
        "--seeds=1,2", "--max_steps=2", "--rank_tokens=64",
    ]  # fmt: skip
    rc, _, err = _study(args)
    assert rc == 0, err[-3000:]
    mlm, random_row = study_dir / "mlm", study_dir / "random_init"
    runs = sorted((mlm / "finetune" / "runs").glob("*.json"))
    assert len(runs) == 2
    kept = _mtimes([runs[0], mlm / "rank.json", *random_row.rglob("*.json")])

    # A fresh machine, mlm's fine-tuning unfinished (one run of two): no checkpoint, no
    # export, no corpus text. The export is needed, so pretraining is too, and the corpus.
    shutil.rmtree(mlm / "workdir")
    shutil.rmtree(mlm / "export")
    for gone in (mlm / "finetune.json", runs[1], study_dir / "corpus" / "train.txt"):
        gone.unlink()
    rc, out, err = _study(args)
    assert rc == 0, err[-3000:]
    assert f"corpus/task_text is done again: {study_dir}/corpus/train.txt is gone; " in err
    assert (
        f"mlm/pretrain is done again: {mlm}/workdir holds no checkpoint of step 6; "
        "mlm/export needs it" in err
    ), err[-3000:]
    assert f"mlm/export is done again: {mlm}/export is gone; mlm/finetune needs it" in err
    assert "mlm/rank already done" in err and "random_init/finetune already done" in err
    assert _mtimes(kept) == kept  # the finished run, the rank and the random row untouched
    assert runs[1].is_file() and "| random_init |" in out
    checkpoint = _mtimes([mlm / "workdir" / "checkpoints" / "6"])

    # The random-init row unfinished, its runs done: it needs mlm's export (its architecture
    # and tokenizer), remade from the checkpoint now there, with nothing pretrained again.
    shutil.rmtree(mlm / "export")
    (random_row / "finetune.json").unlink()
    kept = _mtimes([*mlm.glob("*.json"), *(random_row / "finetune" / "runs").glob("*.json")])
    rc, _, err = _study(args)
    assert rc == 0, err[-3000:]
    assert f"mlm/export is done again: {mlm}/export is gone; random_init/finetune needs" in err
    assert "mlm/pretrain already done" in err and "pretrain is done again" not in err
    changed = {p.name for p, t in _mtimes(kept).items() if t != kept[p]}
    assert changed == {"export.json"}, changed
    assert _mtimes(checkpoint) == checkpoint
    with open(study_dir / "results.json") as f:
        assert [r["row"] for r in json.load(f)["table"]] == ["mlm", "random_init"]
