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


def _squad(f1: list[float], em: list[float], seeds=(1, 2, 3)) -> dict:
    """A SQuAD task summary as the search writes it: its score is F1, EM beside it."""
    med = lambda s: sorted(s)[len(s) // 2]
    return {
        "family": "squad", "seeds": list(seeds), "scores": f1, "median": med(f1),
        "low": min(f1), "high": max(f1),
        "metric_medians": {"dev": {"exact": med(em), "f1": med(f1)}},
        "metric_ranges": {"dev": {"exact": [min(em), max(em)], "f1": [min(f1), max(f1)]}},
    }  # fmt: skip


def _png_width(path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def test_squad_gets_em_and_f1_columns_outside_the_glue_average_and_a_panel_of_its_own(tmp_path):
    def row(sst2, f1, em, glue_average, flops=None):
        tasks = {**_tasks({"sst2": sst2}), "squad_v2": _squad(f1, em)}
        finetune = {"tasks": tasks, "glue_average": glue_average, "seconds": 1}
        if flops is None:
            return {"architecture_of": "mlm", "finetune": finetune}
        pre = {"objective": "mlm", "mask_rate": 0.15, "flops": flops, "seconds": 1.0,
               "tokens_per_sec": 10.0, "final_eval_loss": 5.0}  # fmt: skip
        return {"pretrain": pre, "export": {"encoder_params": 1000}, "finetune": finetune,
                "rank": {"last_layer_entropy_rank": 3.0}}  # fmt: skip

    results = {
        "mlm": row([50.0, 52.0, 60.0], [70.0, 74.0, 80.0], [60.0, 66.0, 71.0], 52.0, 1e12),
        "random_init": row([49.0, 51.0, 50.0], [40.0, 45.0, 41.0], [33.0, 39.0, 35.0], 50.0),
    }
    table, text = report.write(str(tmp_path), results, ["sst2", "squad_v2"])
    mlm = table[0]
    assert mlm["squad_v2 EM"] == 66.0 and mlm["squad_v2 F1"] == 74.0 and "squad_v2" not in mlm
    assert mlm["GLUE avg"] == 52.0  # sst2's alone: SQuAD's 74 is never averaged in
    assert "66.00 (60.0-71.0)" in text and "74.00 (70.0-80.0)" in text
    assert "| squad_v2 EM | squad_v2 F1 | GLUE avg |" in text
    # the GLUE bars are sst2's seeds alone (a SQuAD score averaged in would widen them)
    assert report.seed_range(results["mlm"]["finetune"]["tasks"], ["sst2", "squad_v2"]) == (
        50.0,
        60.0,
    )
    assert json.loads((tmp_path / "results.json").read_text())["table"] == table
    # two panels side by side (GLUE, SQuAD F1): twice the width of GLUE's one
    two = _png_width(tmp_path / "study.png")
    report.write(str(tmp_path), results, ["sst2"])
    assert two == 2 * _png_width(tmp_path / "study.png")
    spread = {"mlm": (70.0, 80.0), "random_init": (40.0, 45.0)}
    panels = {"GLUE avg": {"mlm": (50.0, 60.0)}, "squad_v2 F1": spread}
    assert report.plot(table, str(tmp_path / "p.png"), panels) == 2
