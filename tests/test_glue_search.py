"""A fine-tuning search's folder (`maelm_jax/finetuning/search.py`): what a rerun into it is told,
and which spec.json it accepts. No model runs here: the specs are the dicts `run_search` builds
(test_finetune.py runs whole searches)."""

import dataclasses
import json
import os

import pytest
import torch

from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import search
from maelm_jax.finetuning.model_slot import LoopOptions
from maelm_jax.finetuning.recipe import QUICK

CPU = torch.device("cpu")


def spec(recipe=QUICK, options=None, device=CPU) -> dict:
    """What `run_search` writes, for an export that is only named."""
    return {
        "export": {"path": "/exports/mlm", "model.safetensors": "a" * 64, "config.json": "b" * 64},
        "recipe": dataclasses.asdict(recipe),
        "tasks": ["sst2"],
        "inits": ["pretrained"],
        "data": "/data/glue",
        "compute": search.compute_identity(device),
        "loop": search.loop_identity(options or LoopOptions(), device),
    }


def snapshot(folder) -> dict:
    """Every file under `folder` with its bytes and mtime: what a refusal must leave alone."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[path] = (f.read(), os.stat(path).st_mtime_ns)
    return found


def test_another_recipe_is_refused_naming_each_changed_key_and_both_values(tmp_path):
    out = str(tmp_path / "out")
    search.claim_output_dir(out, spec(dataclasses.replace(QUICK, learning_rates=(2e-5,))))
    (tmp_path / "out" / "runs" / "sst2-pretrained-lr2e-05-bs16-seed1.json").write_text("{}")
    before = snapshot(out)
    changed = dataclasses.replace(QUICK, learning_rates=(3e-5,), seeds=(1, 2))
    with pytest.raises(ConfigError) as refused:
        search.claim_output_dir(out, spec(changed))
    message = str(refused.value)
    assert "learning_rates: [2e-05] -> [3e-05]" in message, message
    assert "seeds: [1] -> [1, 2]" in message, message
    assert "batch_sizes" not in message and "\n" not in message  # only what changed, one line
    assert snapshot(out) == before
    # The same spec again is a resume, not a refusal.
    search.claim_output_dir(out, spec(dataclasses.replace(QUICK, learning_rates=(2e-5,))))


def test_another_export_is_named_by_its_path_and_its_weights_digest(tmp_path):
    out = str(tmp_path / "out")
    search.claim_output_dir(out, spec())
    other = spec()
    other["export"] = {**other["export"], "path": "/exports/mae_lm", "model.safetensors": "c" * 64}
    with pytest.raises(ConfigError) as refused:
        search.claim_output_dir(out, other)
    message = str(refused.value)
    assert 'export.path: "/exports/mlm" -> "/exports/mae_lm"' in message, message
    assert "export.model.safetensors: sha256 aaaaaaaaaaaa... -> sha256 cccccccccccc..." in message


def test_a_compiled_rerun_into_an_eager_search_is_refused_by_name(tmp_path):
    """--compile draws other dropout masks (Inductor's) at other widths (buckets): its runs
    are not those of the eager search the folder holds."""
    out = str(tmp_path / "out")
    search.claim_output_dir(out, spec())
    assert spec()["loop"] == {"compile": "none", "host_dropout": True, "width_buckets": False}
    with pytest.raises(ConfigError) as refused:
        search.claim_output_dir(out, spec(options=LoopOptions(compile=True)))
    message = str(refused.value)
    assert 'loop.compile: "none" -> "default"' in message, message
    assert "loop.host_dropout: true -> false" in message, message
    # The options that change only float rounding are no part of the key.
    search.claim_output_dir(out, spec(options=LoopOptions(fused_adamw=False, check_every=1)))


def test_on_a_gpu_the_loop_key_holds_no_host_dropout():
    cuda = search.loop_identity(LoopOptions(), torch.device("cuda"))
    assert cuda == {"compile": "none", "host_dropout": False, "width_buckets": False}
    compiled = search.loop_identity(LoopOptions(compile=True, compile_mode="reduce-overhead"), CPU)
    assert compiled == {"compile": "reduce-overhead", "host_dropout": False, "width_buckets": True}


def older_spec(tmp_path, results_device=None) -> str:
    """A folder as `run_search` wrote it before `compute` and `loop` were recorded."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    written = {k: v for k, v in spec().items() if k not in ("compute", "loop")}
    (out / "spec.json").write_text(json.dumps(written))
    if results_device:
        (out / "results.json").write_text(json.dumps({"device": results_device}))
    return str(out)


def test_a_search_written_before_compute_was_recorded_resumes_on_its_machine(tmp_path):
    out = older_spec(tmp_path, results_device="cpu")
    search.claim_output_dir(out, spec())  # no refusal
    with open(os.path.join(out, "spec.json")) as f:
        assert json.load(f) == json.loads(json.dumps(spec()))  # now recorded: checked later
    search.claim_output_dir(out, spec())


def test_a_search_written_before_compute_was_recorded_keeps_its_results_device(tmp_path):
    out = older_spec(tmp_path, results_device="cuda")
    before = snapshot(out)
    with pytest.raises(ConfigError, match=r"computed on device=cuda.*computes on device=cpu"):
        search.claim_output_dir(out, spec())
    assert snapshot(out) == before
