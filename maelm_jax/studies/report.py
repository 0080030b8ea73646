"""A study's results: one table (study.md), one JSON (results.json) and one plot (study.png):
GLUE average against pretraining FLOPs, the random-init row as the floor pretraining must
clear. The plot draws each row's range over seeds (the GLUE average of each seed's runs):
at a small scale the rows' medians can fall in a clean order that the seeds do not support."""

import os

from maelm_jax.finetuning.search import write_json
from maelm_jax.glue import metrics
from maelm_jax.studies.plan import RANDOM_ROW


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
                **{t: tasks[t]["median"] for t in task_names},
                "GLUE avg": row["finetune"]["glue_average"],
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
    every task (each at the task's reported setting); None without a common seed list."""
    seeds = {tuple(tasks[t]["seeds"]) for t in task_names}
    if len(seeds) != 1:
        return None
    averages = [
        metrics.glue_score({t: tasks[t]["scores"][i] for t in task_names})
        for i in range(len(next(iter(seeds))))
    ]
    return min(averages), max(averages)


def plot(table: list[dict], path: str, ranges: dict[str, tuple[float, float] | None]) -> None:
    """`ranges`: each row's seed range of its GLUE average, drawn as its error bar (the
    random-init row's as a band around its line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in table:
        y, spread = r["GLUE avg"], ranges.get(r["row"])
        if r["row"] == RANDOM_ROW:
            ax.axhline(y, color="gray", linestyle="--", label="random init")
            if spread:
                ax.axhspan(*spread, color="gray", alpha=0.15, label="random init, seed range")
            continue
        yerr = [[y - spread[0]], [spread[1] - y]] if spread else None
        ax.errorbar(r["pretraining FLOPs"], y, yerr=yerr, fmt="o", capsize=4)
        ax.annotate(r["row"], (r["pretraining FLOPs"], y), fontsize=8)
    ax.set_xlabel("pretraining FLOPs (analytic)")
    ax.set_ylabel("GLUE average (dev; bars: seed range)")
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(study_dir: str, results: dict, task_names: list[str]) -> tuple[list[dict], str]:
    table = rows(results, task_names)
    spread = {
        name: {
            t: f"{row['finetune']['tasks'][t]['low']:.1f}-{row['finetune']['tasks'][t]['high']:.1f}"
            for t in task_names
        }
        for name, row in results.items()
    }
    text = markdown(table, spread)
    with open(os.path.join(study_dir, "study.md"), "w") as f:
        f.write(text + "\n")
    write_json(os.path.join(study_dir, "results.json"), {"rows": results, "table": table})
    ranges = {
        name: seed_range(row["finetune"]["tasks"], task_names) for name, row in results.items()
    }
    plot(table, os.path.join(study_dir, "study.png"), ranges)
    return table, text
