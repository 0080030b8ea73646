"""A study resumed from a copy of its folder that holds only what is small (the spec, the
markers, the fine-tuning searches): it pretrains and exports again only what an unfinished
stage needs, says why, remakes what the row made from a model that is gone, and keeps every
finished fine-tuning run of the same export; and a study folder moved to another path."""

import json
import shutil

from test_study import CONFIG, _one_line, _sst2, _study

from maelm_jax.finetuning import search


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
    kept = _mtimes([runs[0], *random_row.rglob("*.json")])

    # A fresh machine, mlm's fine-tuning unfinished (one run of two): no checkpoint, no
    # export, no corpus text. The export is needed, so pretraining is too, and the corpus;
    # the rank measured the model that is gone. The CPU's pretraining is bit-exact: the
    # search moved aside is taken back for the same export, its finished run kept.
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
    assert f"mlm/finetune is done again: {mlm}/finetune fine-tuned the export made" in err
    assert "mlm/finetune takes back" in err and "mlm/rank is done again: it measured" in err
    assert "random_init/finetune already done" in err
    assert _mtimes(kept) == kept  # the finished run and the random row untouched
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

    # A copy with mlm's rank unfinished and its checkpoint gone, its export and search there.
    # The export and search are marked as another model's (a GPU's rerun is not bit-exact):
    # both are moved aside and remade, so the row's GLUE, loss and rank are of one model.
    shutil.rmtree(mlm / "workdir")
    (mlm / "rank.json").unlink()
    (mlm / "export" / "model.safetensors").write_bytes(b"model A's weights")
    spec_path = mlm / "finetune" / search.SPEC_FILE
    spec = json.loads(spec_path.read_text())
    spec["export"] = search.export_identity(str(mlm / "export"))
    spec_path.write_text(json.dumps(spec))
    rc, _, err = _study(args)
    assert rc == 0, err[-3000:]
    for stage in ("export", "finetune"):
        assert f"mlm/{stage} is done again: {mlm}/{stage}" in err, err[-3000:]
    new = json.loads(spec_path.read_text())["export"]
    assert new == search.export_identity(str(mlm / "export")) != spec["export"]
    assert (mlm / "export.json").stat().st_mtime_ns > (mlm / "pretrain.json").stat().st_mtime_ns
    assert (mlm / "finetune.json").stat().st_mtime_ns > (mlm / "export.json").stat().st_mtime_ns
    (old,) = mlm.glob("finetune.stale-*")
    assert json.loads((old / search.SPEC_FILE).read_text())["export"] == spec["export"]
    assert len(list(mlm.glob("export.stale-*"))) == 1

    # The folder moved to another path, mlm's fine-tuning unfinished (one run of two): every
    # finished stage is already done, the finished run is kept, the search names the export
    # where it is now.
    moved = tmp_path / "moved"
    shutil.move(study_dir, moved)
    (moved / "mlm" / "finetune.json").unlink()
    (done, gone) = sorted((moved / "mlm" / "finetune" / "runs").glob("*.json"))
    gone.unlink()
    kept = _mtimes([done])
    rc, _, err = _study([f"--study_dir={moved}", *args[1:]])
    assert rc == 0, err[-3000:]
    for stage in ("corpus/task_text", "mlm/pretrain", "mlm/export", "mlm/rank"):
        assert f"{stage} already done" in err, stage
    assert "random_init/finetune already done" in err and "is done again" not in err
    assert _mtimes(kept) == kept and gone.is_file()
    spec = json.loads((moved / "mlm" / "finetune" / search.SPEC_FILE).read_text())
    assert spec["export"]["path"] == str(moved / "mlm" / "export")
