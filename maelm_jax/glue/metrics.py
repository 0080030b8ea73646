"""GLUE's metrics, from scikit-learn and scipy as HF `evaluate`'s glue metric computes them,
so scores compare with published dev numbers. Metrics are fractions; task and GLUE
scores are in points (x100), as papers report them."""

import warnings

import numpy as np

from maelm_jax.glue.tasks import Task

METRICS = ("accuracy", "f1", "matthews", "pearson", "spearman")


def metric(name: str, predictions, labels) -> float:
    """`predictions` are class ids for the classification metrics, scores for the correlations;
    F1 is binary with class 1 positive (MRPC's "equivalent", QQP's "duplicate")."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape != labels.shape:
        raise ValueError(
            f"metric {name!r}: {predictions.shape} predictions for {labels.shape} labels"
        )
    if name in ("pearson", "spearman"):
        import scipy.stats

        correlation = scipy.stats.pearsonr if name == "pearson" else scipy.stats.spearmanr
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns on constant input; handled below
            value = float(correlation(predictions, labels)[0])
        # An untrained model that predicts one value has no correlation with the labels;
        # scipy's NaN would poison the medians and means taken over seeds.
        return 0.0 if np.isnan(value) else value
    import sklearn.metrics

    if name == "accuracy":
        return float(sklearn.metrics.accuracy_score(labels, predictions))
    if name == "f1":
        return float(
            sklearn.metrics.f1_score(
                labels, predictions, average="binary", pos_label=1, zero_division=0.0
            )
        )
    if name == "matthews":
        return float(sklearn.metrics.matthews_corrcoef(labels, predictions))
    raise ValueError(f"unknown GLUE metric {name!r}; allowed: {', '.join(METRICS)}")


def split_metrics(task: Task, predictions, labels) -> dict[str, float]:
    """Every metric of `task` on one dev split (class ids, or floats for STS-B)."""
    return {name: metric(name, predictions, labels) for name in task.metrics}


def task_score(task: Task, metrics_by_split: dict[str, dict[str, float]]) -> float:
    """GLUE's rule: the mean of the task's metrics (MRPC: F1 and accuracy), and for MNLI also
    the mean over its matched and mismatched dev sets; in points."""
    per_split = []
    for split in task.dev_splits:
        found = metrics_by_split.get(split, {})
        missing = [m for m in task.metrics if m not in found]
        if missing:
            raise ValueError(
                f"{task.name}: no {', '.join(missing)} for dev split {split!r}; a score "
                f"needs {', '.join(task.metrics)} on each of {', '.join(task.dev_splits)}"
            )
        per_split.append(np.mean([found[m] for m in task.metrics]))
    return float(100.0 * np.mean(per_split))


def glue_score(scores: dict[str, float]) -> float:
    """The unweighted mean over tasks of their `task_score` (points)."""
    if not scores:
        raise ValueError("glue_score: no task scores")
    return float(np.mean(list(scores.values())))
