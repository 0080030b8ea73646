"""`python -m maelm_jax.study --preset`: the GPU scale's configs are what ran on the H200 and
make one study, the preset fills exactly the flags a user left out, and a copied study folder
is planned to redo only the finished stages whose outputs an unfinished stage needs."""

import json
import os
import shutil

import pytest
from absl import flags
from tiny_configs import REPO_ROOT, tiny_config

from maelm_jax import study
from maelm_jax.config import cli, configdict
from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError
from maelm_jax.finetuning import search
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.glue.tasks import TASKS
from maelm_jax.studies import plan, presets, resume

GPU_CONFIGS = REPO_ROOT / "configs" / "study" / "gpu_scale"
# The run of 2026-11-28 on one H200 (issue #62's command), the GPU preset's measured scale.
MEASURED_OVERRIDES = {
    "model.num_layers": "6", "model.hidden_size": "512", "model.num_heads": "8",
    "model.mlp_dim": "2048", "model.num_decoder_layers": "2", "model.dtype": "'bfloat16'",
    "model.dropout_rate": "0.1", "model.attention_dropout_rate": "0.1", "vocab_size": "8192",
    "batch_size": "128", "num_train_steps": "3000", "eval_every_steps": "1000",
    "checkpoint_every_steps": "3000", "log_every_steps": "500", "learning_rate": "5e-4",
    "warmup_steps": "300",
}  # fmt: skip
OBJECTIVES = ("mlm", "mae_lm", "three_ml_self", "three_ml_cross")


def _load(folder, names=OBJECTIVES) -> dict:
    return {n: cli.load_config_file(str(folder / f"{n}.py"), flag="configs") for n in names}


def test_the_gpu_configs_are_the_measured_run_freeze_and_make_one_study():
    gpu = plan.with_overrides(_load(GPU_CONFIGS), {})  # refuses configs that differ in data
    cpu = plan.with_overrides(_load(REPO_ROOT / "configs" / "study"), MEASURED_OVERRIDES)
    for name in OBJECTIVES:
        assert gpu[name].to_dict() == cpu[name].to_dict(), name
        run = configdict.freeze(gpu[name])
        assert (run.model.num_layers, run.model.hidden_size, run.model.num_heads) == (6, 512, 8)
        assert run.data.dataset == STUDY_TASK_TEXT
    assert gpu["mae_lm"].model.num_decoder_layers == 2 and gpu["mlm"].objective == "mlm"
    assert gpu["three_ml_cross"].model.decoder == "cross"
    assert gpu["three_ml_self"].mask_rate == 0.5


def _parsed(*argv: str) -> flags.FlagValues:
    """The study's flags parsed by absl from `argv`, as `main` gets them."""
    flag_values = flags.FlagValues()
    study.define_flags(flag_values)
    flag_values(["study", "--study_dir=unused", *argv])
    return flag_values


def _resolved(*argv: str) -> flags.FlagValues:
    flag_values = _parsed(*argv)
    presets.apply(flag_values)
    return flag_values


def _preset_flags(flag_values) -> dict:
    return {name: flag_values[name].value for name in presets.PRESETS["gpu"]}


TODAYS_DEFAULTS = {
    "configs": [str(REPO_ROOT / "configs" / "study" / f"{n}.py") for n in OBJECTIVES],
    "tasks": "cola,sst2,rte,stsb", "seeds": ["1", "2", "3"], "learning_rates": ["1e-3"],
    "batch_sizes": ["32"], "epochs": 3.0, "max_steps": 100, "max_seq_length": 64,
}  # fmt: skip
GPU_PRESET = {
    "configs": [str(GPU_CONFIGS / "mlm.py"), str(GPU_CONFIGS / "mae_lm.py")],
    "tasks": "cola,sst2,rte,stsb", "seeds": ["1", "2", "3"], "learning_rates": ["1e-4"],
    "batch_sizes": ["32"], "epochs": 10.0, "max_steps": 150, "max_seq_length": 128,
}  # fmt: skip


def test_the_presets_resolve_to_their_documented_flags_unless_a_flag_is_given():
    assert _preset_flags(_resolved()) == TODAYS_DEFAULTS
    assert _preset_flags(_resolved("--preset=cpu")) == TODAYS_DEFAULTS
    assert _preset_flags(_resolved("--preset=gpu")) == GPU_PRESET
    given = _resolved("--preset=gpu", "--seeds=1", "--max_steps=0", "--configs=a.py,b.py")
    assert _preset_flags(given) == {
        **GPU_PRESET, "seeds": ["1"], "max_steps": 0, "configs": ["a.py", "b.py"]
    }  # fmt: skip
    # a flag given, even at the preset's own value, is the user's: the preset leaves it
    set_by_preset = presets.apply(_parsed("--preset=gpu", "--epochs=10"))
    differ = {k for k, v in GPU_PRESET.items() if v != TODAYS_DEFAULTS[k]}
    assert set(set_by_preset) == differ - {"epochs"} and "max_steps" in differ
    for path in GPU_PRESET["configs"]:
        assert os.path.isfile(path), path


def test_an_unknown_preset_is_refused_naming_the_ones_there_are():
    with pytest.raises(ConfigError) as e:
        _resolved("--preset=tpu")
    assert str(e.value) == "--preset=tpu: no such preset; give one of cpu, gpu"


def _study_of_two() -> plan.Study:
    configs = {"mlm": tiny_config("mlm"), "mae_lm": tiny_config("mae_lm")}
    for config in configs.values():
        config.dataset = STUDY_TASK_TEXT
    return plan.Study(configs, (TASKS["sst2"],), Recipe(), glue_dir=None, rank_tokens=64)


def _copied_folder(root, unfinished: tuple[str, ...], exports: tuple[str, ...]) -> str:
    """A study folder as a copy holds it: every stage's marker but `unfinished`, the corpus's
    marker without its text, no checkpoint, and the exports of `exports` only."""
    stages = [("corpus", "task_text"), ("random_init", "finetune")]
    stages += [
        (r, s) for r in ("mlm", "mae_lm") for s in ("pretrain", "export", "finetune", "rank")
    ]
    for row, stage in stages:
        if f"{row}/{stage}" not in unfinished:
            os.makedirs(root / row, exist_ok=True)
            (root / row / f"{stage}.json").write_text("{}")
    for row in exports:
        os.makedirs(root / row / "export")
        for name in ("config.json", "model.safetensors"):
            (root / row / "export" / name).write_text("{}")
    return str(root)


@pytest.mark.parametrize(
    "unfinished,exports,redone",
    [
        ((), (), []),  # every stage finished: nothing is needed, nothing redone
        (("mae_lm/finetune",), ("mae_lm",), []),  # its export is there
        # what the row made from the model whose checkpoint is gone goes with it: its rank
        (("mae_lm/finetune",), (), ["mae_lm/pretrain", "mae_lm/export", "mae_lm/rank"]),
        # the rank reads the checkpoint; the export and its GLUE runs were the old model's
        (("mlm/rank",), ("mlm",), ["mlm/pretrain", "mlm/export", "mlm/finetune"]),
        # the random-init row fine-tunes the first objective's architecture, from its export;
        # it keeps its own runs (not the weights), the mlm row is remade whole
        (
            ("random_init/finetune",),
            ("mae_lm",),
            ["mlm/pretrain", "mlm/export", "mlm/finetune", "mlm/rank"],
        ),
        # an export that never finished needs the checkpoint as much as one that is gone
        (("mlm/export", "mlm/finetune"), (), ["mlm/pretrain", "mlm/rank"]),
    ],
    ids=["all_done", "export_there", "export_gone", "rank", "random_row", "export_unfinished"],
)
def test_a_copied_folder_redoes_only_the_stages_an_unfinished_one_needs(
    tmp_path, unfinished, exports, redone
):
    study_dir = _copied_folder(tmp_path, unfinished, exports)
    found = resume.stale(_study_of_two(), study_dir)
    corpus = [("corpus", "task_text")] if any("pretrain" in r for r in redone) else []
    assert [(row, stage) for row, stage, _ in found] == corpus + [
        tuple(r.split("/")) for r in redone
    ]
    for row, stage, why in found:  # why: the path that is gone, and the stages needing it
        assert ("is gone" if stage != "pretrain" else "holds no checkpoint of step") in why, why
        assert "\n" not in why and row in why
    stages = [f"{row}/{stage}" for row, stage, _ in found]
    assert resume.reopen(_study_of_two(), study_dir) == found
    todo = ("pretrain", "export", "finetune", "rank")
    for row, stage in ((r, s) for r in ("mlm", "mae_lm") for s in todo):
        # a stage done again has no marker, and its old folder is moved aside, not lost
        assert (tmp_path / row / f"{stage}.json").exists() == (
            f"{row}/{stage}" not in stages + list(unfinished)
        ), (row, stage)
        moved = [n for n in os.listdir(tmp_path / row) if n.startswith(f"{stage}.stale-")]
        assert len(moved) == (stage == "export" and f"{row}/{stage}" in stages and row in exports)
    assert (tmp_path / "random_init" / "finetune.json").exists() != (
        "random_init/finetune" in unfinished
    )


def test_a_search_whose_runs_fine_tuned_another_export_is_refused_in_the_studys_words(tmp_path):
    """A pretraining done again need not be bit-exact (a GPU's is not): its export is another
    model, and the row's finished runs are not mixed with its runs. A study folder that moved
    keeps them: the same bytes at the same place under the new root."""
    export_dir, search_dir = tmp_path / "a" / "mlm" / "export", tmp_path / "a" / "mlm" / "finetune"
    for folder in (export_dir, search_dir / "runs"):
        folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (export_dir / name).write_text("the weights")
    (search_dir / "runs" / "sst2-pretrained-seed1.json").write_text("{}")
    spec = {"export": search.export_identity(str(export_dir)), "tasks": ["sst2"]}
    (search_dir / "spec.json").write_text(json.dumps(spec))
    resume.check_search("mlm", str(export_dir), str(search_dir))  # the same export: goes on

    # moved to another path: the spec names the export where it is now, the rest unchanged
    moved = tmp_path / "b"
    shutil.move(tmp_path / "a", moved)
    resume.check_search("mlm", str(moved / "mlm" / "export"), str(moved / "mlm" / "finetune"))
    now = json.loads((moved / "mlm" / "finetune" / "spec.json").read_text())
    assert now == {**spec, "export": {**spec["export"], "path": str(moved / "mlm" / "export")}}
    export_dir, search_dir = moved / "mlm" / "export", moved / "mlm" / "finetune"

    # a search moved aside for a pretraining done again comes back for the same bytes only
    aside = moved / "mlm" / "finetune.stale-20261201-120000"
    search_dir.rename(aside)
    resume.check_search("mlm", str(export_dir), str(search_dir))
    assert not aside.exists() and (search_dir / "runs" / "sst2-pretrained-seed1.json").is_file()
    (export_dir / "model.safetensors").write_text("weights pretrained again")
    with pytest.raises(ConfigError) as e:
        resume.check_search("mlm", str(export_dir), str(search_dir))
    assert str(e.value).startswith("mlm: its fine-tuning search's 1 finished run(s) fine-tuned")
    assert f"copy that export from the machine it ran on, or delete {search_dir}" in str(e.value)
    search_dir.rename(aside)
    resume.check_search("mlm", str(export_dir), str(search_dir))
    assert aside.is_dir() and not search_dir.exists()  # fine-tuned afresh, the old runs kept

    # the same bytes somewhere that is not this study's place for them
    aside.rename(search_dir)
    (export_dir / "model.safetensors").write_text("the weights")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(export_dir, elsewhere)
    with pytest.raises(ConfigError) as e:
        resume.check_search("mlm", str(elsewhere), str(search_dir))
    assert f"fine-tuned the export at {export_dir}, and this study folder's is at" in str(e.value)
    assert "not the same place in a moved folder" in str(e.value)
