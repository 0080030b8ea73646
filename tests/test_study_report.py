"""The study's report: each row's range over seeds, the bars study.png draws, is the GLUE
average of each seed's runs, not the spread of the task medians."""

import json

import pytest

from maelm_jax.studies import report


def _tasks(scores: dict[str, list[float]], seeds=(1, 2, 3)) -> dict:
    return {
        t: {"seeds": list(seeds), "scores": s, "median": sorted(s)[len(s) // 2], "low": min(s),
            "high": max(s)}
        for t, s in scores.items()
    }  # fmt: skip


def test_a_rows_seed_range_averages_each_seed_over_the_tasks():
    tasks = _tasks({"sst2": [50.0, 60.0, 70.0], "rte": [70.0, 50.0, 54.0]})
    # seed 1: (50 + 70) / 2 = 60, seed 2: 55, seed 3: 62; the task ranges would give 50-70
    assert report.seed_range(tasks, ["sst2", "rte"]) == (55.0, 62.0)
    assert report.seed_range(tasks, ["sst2"]) == (50.0, 70.0)
    uneven = {**tasks, "rte": {**tasks["rte"], "seeds": [1, 2]}}
    assert report.seed_range(uneven, ["sst2", "rte"]) is None


def test_the_report_writes_the_table_the_json_and_a_plot_with_bars(tmp_path):
    def row(scores, flops):
        tasks = _tasks({"sst2": scores})
        pre = {"objective": "mlm", "mask_rate": 0.15, "flops": flops, "seconds": 1.0,
               "tokens_per_sec": 10.0, "final_eval_loss": 5.0}  # fmt: skip
        return {
            "pretrain": pre,
            "export": {"encoder_params": 1000},
            "finetune": {"tasks": tasks, "glue_average": tasks["sst2"]["median"], "seconds": 1},
            "rank": {"last_layer_entropy_rank": 3.0},
        }

    results = {
        "mlm": row([50.0, 52.0, 60.0], 1e12),
        "random_init": {
            "architecture_of": "mlm",
            "finetune": {
                "tasks": _tasks({"sst2": [49.0, 51.0, 50.0]}),
                "glue_average": 50.0,
                "seconds": 1,
            },
        },
    }
    table, text = report.write(str(tmp_path), results, ["sst2"])
    assert "| mlm |" in text and "52.00 (50.0-60.0)" in text
    assert json.loads((tmp_path / "results.json").read_text())["table"] == table
    assert (tmp_path / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KeyError):  # a task the rows were not fine-tuned on
        report.write(str(tmp_path), results, ["rte"])
