"""A study's results: one table (study.md), one JSON (results.json) and one plot (study.png):
GLUE average against pretraining FLOPs, the random-init row as the floor pretraining must
clear, and beside it a panel of SQuAD F1 when SQuAD is among the tasks. The plot draws each
row's range over seeds (the GLUE average of each seed's runs; SQuAD's F1 of each seed): at a
small scale the rows' medians can fall in a clean order that the seeds do not support. SQuAD's
EM and F1 are columns of their own, never in the GLUE average (the papers report them apart).
"""

import os

from maelm_jax.finetuning.search import write_json
from maelm_jax.glue import metrics
from maelm_jax.studies.plan import RANDOM_ROW

GLUE_AVERAGE = "GLUE avg"
# A SQuAD task's columns: (column suffix, its metric in the official evaluation's words)
SQUAD_COLUMNS = (("EM", "exact"), ("F1", "f1"))


def is_squad(task: dict) -> bool:
    """A task summary of SQuAD's family (finetuning/search.py TaskSummary.family)."""
    return task.get("family", "glue") == "squad"


def _task_columns(tasks: dict, task_names: list[str]) -> dict:
    """{column: median}: a GLUE task's score, a SQuAD task's EM and F1 (points)."""
    out = {}
    for t in task_names:
        if is_squad(tasks[t]):
            dev = tasks[t]["metric_medians"]["dev"]
            out.update({f"{t} {label}": dev[m] for label, m in SQUAD_COLUMNS})
        else:
            out[t] = tasks[t]["median"]
    return out


def _task_spreads(tasks: dict, task_names: list[str]) -> dict[str, str]:
    """{column: "low-high"} over the seeds, for the columns `_task_columns` gives."""
    out = {}
    for t in task_names:
        task = tasks[t]
        if is_squad(task):  # a run's score is its F1, so F1's range is the score's
            ranges = {
                "f1": (task["low"], task["high"]),
                **task.get("metric_ranges", {}).get("dev", {}),
            }
            for label, m in SQUAD_COLUMNS:
                if m in ranges:
                    out[f"{t} {label}"] = "{:.1f}-{:.1f}".format(*ranges[m])
        else:
            out[t] = f"{task['low']:.1f}-{task['high']:.1f}"
    return out


def _shape(pretrain: dict | None) -> str:
    if pretrain is None:
        return "-"
    if pretrain["objective"] == "mlm":
        return f"MLM {pretrain['mask_rate']:.0%} / none"
    return (
        f"{pretrain['decoder']} {pretrain['mask_rate']:.0%} / "
        f"{pretrain['num_decoder_layers']} decoder layer(s)"
    )


def rows(results: dict, task_names: list[str]) -> list[dict]:
    out = []
    for name, row in results.items():
        pre = row.get("pretrain")
        tasks = row["finetune"]["tasks"]
        out.append(
            {
                "row": name,
                "objective / decoder": _shape(pre)
                if pre
                else f"none (random init, {row['architecture_of']}'s encoder)",
                "params (encoder)": results[row.get("architecture_of", name)]["export"][
                    "encoder_params"
                ],
                "pretraining FLOPs": pre["flops"] if pre else 0.0,
                "pretraining s": pre["seconds"] if pre else 0.0,
                "tokens/s": pre["tokens_per_sec"] if pre else None,
                "final eval loss": pre["final_eval_loss"] if pre else None,
                **_task_columns(tasks, task_names),
                GLUE_AVERAGE: row["finetune"]["glue_average"],
                "last-layer rank": row["rank"]["last_layer_entropy_rank"]
                if "rank" in row
                else None,
                "finetune s": row["finetune"]["seconds"],
            }
        )
    return out


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            return f"{value:.3g}"
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value / 1e6:.2f}M"
    return str(value)


def markdown(table: list[dict], spread: dict[str, dict[str, str]]) -> str:
    """The table, task cells as `median (low-high)` over seeds."""
    header = list(table[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in table:
        cells = []
        for key in header:
            cell = _cell(r[key])
            if key in spread.get(r["row"], {}):
                cell += f" ({spread[r['row']][key]})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seed_range(tasks: dict, task_names: list[str]) -> tuple[float, float] | None:
    """(lowest, highest) GLUE average over seeds: seed i's average is its runs' scores on
    every GLUE task (each at the task's reported setting; SQuAD's are left out, as from the
    average); None without a GLUE task or a common seed list."""
    task_names = [t for t in task_names if not is_squad(tasks[t])]
    seeds = {tuple(tasks[t]["seeds"]) for t in task_names}
    if len(seeds) != 1:
        return None
    averages = [
        metrics.glue_score({t: tasks[t]["scores"][i] for t in task_names})
        for i in range(len(next(iter(seeds))))
    ]
    return min(averages), max(averages)


def plot(
    table: list[dict], path: str, panels: dict[str, dict[str, tuple[float, float] | None]]
) -> int:
    """One panel per column of `panels` ("GLUE avg", then each SQuAD task's F1), against
    pretraining FLOPs; `panels[column]` holds each row's seed range, drawn as its error bar
    (the random-init row's as a band around its dashed line). Returns the panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (column, ranges) in zip(axes[0], panels.items(), strict=True):
        for r in table:
            y, spread = r[column], ranges.get(r["row"])
            if y is None:
                continue
            if r["row"] == RANDOM_ROW:
                ax.axhline(y, color="gray", linestyle="--", label="random init")
                if spread:
                    ax.axhspan(*spread, color="gray", alpha=0.15, label="random init, seed range")
                continue
            yerr = [[y - spread[0]], [spread[1] - y]] if spread else None
            ax.errorbar(r["pretraining FLOPs"], y, yerr=yerr, fmt="o", capsize=4)
            ax.annotate(r["row"], (r["pretraining FLOPs"], y), fontsize=8)
        ax.set_xlabel("pretraining FLOPs (analytic)")
        what = "GLUE average" if column == GLUE_AVERAGE else column
        ax.set_ylabel(f"{what} (dev; bars: seed range)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    drawn = len(fig.axes)
    plt.close(fig)
    return drawn


def write(study_dir: str, results: dict, task_names: list[str]) -> tuple[list[dict], str]:
    table = rows(results, task_names)
    spread = {
        name: _task_spreads(row["finetune"]["tasks"], task_names) for name, row in results.items()
    }
    text = markdown(table, spread)
    with open(os.path.join(study_dir, "study.md"), "w") as f:
        f.write(text + "\n")
    write_json(os.path.join(study_dir, "results.json"), {"rows": results, "table": table})
    squad, glue = [], []
    for t in task_names:  # every row was fine-tuned on the same tasks: the first says which
        (squad if is_squad(next(iter(results.values()))["finetune"]["tasks"][t]) else glue).append(
            t
        )
    panels = {}
    if glue:
        panels[GLUE_AVERAGE] = {
            name: seed_range(row["finetune"]["tasks"], glue) for name, row in results.items()
        }
    for t in squad:  # a run's score is its F1
        panels[f"{t} F1"] = {
            name: (row["finetune"]["tasks"][t]["low"], row["finetune"]["tasks"][t]["high"])
            for name, row in results.items()
        }
    plot(table, os.path.join(study_dir, "study.png"), panels)
    return table, text
