"""GLUE's tasks as data: where each one's text and label live, in GLUE's own download and in
TFDS, its label set and its metrics.

WNLI is left out, as RoBERTa, MAE-LM and 3ML leave it out. Label ids follow GLUE's and TFDS's
order (`labels[i]` is id i), so a model fine-tuned on either source predicts the same ids.
"""

import dataclasses

from maelm_jax.config.run_config import ConfigError


@dataclasses.dataclass(frozen=True)
class Task:
    name: str  # as on the command line and in TFDS: glue/<name>
    glue_dir: str  # the folder in GLUE's download
    text_columns: tuple[str, ...]  # one sentence, or a pair (header names, or TFDS features)
    label_column: str
    labels: tuple[str, ...]  # the label strings of the files, id = index; () = regression
    metrics: tuple[str, ...]  # the task's score is their mean (GLUE's rule)
    dev_splits: tuple[str, ...] = ("dev",)  # file stems in GLUE's layout
    header: bool = True  # CoLA's files have none (columns: source, label, mark, sentence)

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1

    def tfds_split(self, split: str) -> str:
        """TFDS's split for a GLUE file stem: train, validation, validation_matched, ..."""
        return "train" if split == "train" else split.replace("dev", "validation")


TASKS = {
    t.name: t
    for t in (
        Task(
            "cola",
            "CoLA",
            ("sentence",),
            "label",
            ("0", "1"),
            ("matthews",),
            header=False,
        ),
        Task("sst2", "SST-2", ("sentence",), "label", ("0", "1"), ("accuracy",)),
        Task(
            "mrpc",
            "MRPC",
            ("#1 String", "#2 String"),
            "Quality",
            ("0", "1"),
            ("f1", "accuracy"),
        ),
        Task(
            "stsb",
            "STS-B",
            ("sentence1", "sentence2"),
            "score",
            (),
            ("pearson", "spearman"),
        ),
        Task(
            "qqp",
            "QQP",
            ("question1", "question2"),
            "is_duplicate",
            ("0", "1"),
            ("f1", "accuracy"),
        ),
        Task(
            "mnli",
            "MNLI",
            ("sentence1", "sentence2"),
            "gold_label",
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            dev_splits=("dev_matched", "dev_mismatched"),
        ),
        Task(
            "qnli",
            "QNLI",
            ("question", "sentence"),
            "label",
            ("entailment", "not_entailment"),
            ("accuracy",),
        ),
        Task(
            "rte",
            "RTE",
            ("sentence1", "sentence2"),
            "label",
            ("entailment", "not_entailment"),
            ("accuracy",),
        ),
    )
}


def resolve(names: list[str] | str) -> list[Task]:
    """The tasks named, in the order given; ConfigError naming an unknown one."""
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    tasks = []
    for raw in names:
        name = raw.strip().lower().replace("-", "")
        if name not in TASKS:
            raise ConfigError(
                f"--tasks: unknown GLUE task {raw!r}; allowed: {', '.join(TASKS)} "
                "(WNLI is left out, as the papers leave it out)"
            )
        if TASKS[name] not in tasks:
            tasks.append(TASKS[name])
    if not tasks:
        raise ConfigError(f"--tasks: no task given; allowed: {', '.join(TASKS)}")
    return tasks
