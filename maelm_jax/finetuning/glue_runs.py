"""A GLUE task as the fine-tuning search runs it: its rows encoded once (and the train split
uploaded once) for all its runs, a fresh sequence classifier per run (glue/classifier.py),
GLUE's loss on the `<s>` head and GLUE's metrics on every dev split (training.py's defaults).
"""

from maelm_jax.finetuning.training import (
    DeviceSplit,
    Encoded,
    RunSpec,
    encode,
    fine_tune,
    to_device,
)
from maelm_jax.glue import classifier, tasks
from maelm_jax.glue.readers import Example

FAMILY = "glue"


class GlueRuns:
    """The runs of one GLUE task on one export."""

    def __init__(
        self,
        task: tasks.Task,
        tokenizer,
        train: list[Example],
        dev: dict[str, list[Example]],
        export_dir: str,
        device,
        max_seq_length: int,
    ):
        self.task, self.tokenizer = task, tokenizer
        self.export_dir, self.device = export_dir, device
        self.train, self.dev, self.max_seq_length = train, dev, max_seq_length
        self.encoded: tuple[Encoded, dict[str, Encoded], DeviceSplit] | None = None

    @property
    def train_size(self) -> int:
        return len(self.train)

    def run(self, run: RunSpec, slot, on_step, run_dir: str):
        del run_dir  # GLUE's runs keep no files beyond their JSON
        pad_id = self.tokenizer.pad_token_id
        if self.encoded is None:
            train = encode(self.tokenizer, self.train, run.max_seq_length)
            dev = {s: encode(self.tokenizer, d, run.max_seq_length) for s, d in self.dev.items()}
            on_device = to_device(train, pad_id, self.device, self.task.is_regression)
            self.encoded = (train, dev, on_device)
        train, dev, on_device = self.encoded
        task = self.task

        def factory():
            return classifier.classifier(
                self.export_dir, task.num_labels, run.init, run.dropout, run.attention_dropout
            )

        return fine_tune(
            factory, task, train, dev, run, pad_id, self.device,
            on_step=on_step, slot=slot, train_on_device=on_device,
        )  # fmt: skip
