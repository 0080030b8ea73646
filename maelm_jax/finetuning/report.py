"""The search's results as a table for people (the JSON is results.json as it stands)."""

_SHORT = {"accuracy": "acc", "matthews": "mcc", "pearson": "pearson", "spearman": "spearman"}


def _detail(task: dict) -> str:
    if task.get("family", "glue") == "squad":  # the official evaluation's, at threshold 1.0
        dev = task["metric_medians"]["dev"]
        ranges = task.get("metric_ranges", {}).get("dev", {})
        return ", ".join(
            f"{label} {dev[m]:.1f}" + (" ({:.1f}-{:.1f})".format(*ranges[m]) if m in ranges else "")
            for label, m in (("EM", "exact"), ("F1", "f1"))
        )
    parts = []
    for split, values in task["metric_medians"].items():
        prefix = "" if split == "dev" else f"{split.removeprefix('dev_')} "
        parts += [f"{prefix}{_SHORT.get(m, m)} {v:.1f}" for m, v in values.items()]
    return ", ".join(parts)


def table(result: dict) -> str:
    """One row per task and init: the task's score (GLUE's mean of its metrics, points; SQuAD's
    F1, with EM and F1 in its metrics), the seeds' range, the chosen setting; then the GLUE
    average per init, of GLUE's tasks alone (SQuAD is never averaged in)."""
    header = ("task", "init", "score", "range", "metrics (medians)", "lr", "batch", "seeds")
    rows = [
        (
            t["task"],
            t["init"],
            f"{t['median']:.1f}",
            f"{t['low']:.1f}-{t['high']:.1f}",
            _detail(t),
            f"{t['learning_rate']:g}",
            str(t["batch_size"]),
            str(len(t["seeds"])),
        )
        for t in result["tasks"]
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for init, score in result["glue_score"].items():
        tasks = sum(
            t["init"] == init and t.get("family", "glue") == "glue" for t in result["tasks"]
        )
        lines.append(f"GLUE average ({init}, the median of each of {tasks} task(s)): {score:.1f}")
    return "\n".join(lines)
