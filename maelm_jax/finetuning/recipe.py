"""The fine-tuning recipes: RoBERTa's published GLUE search space, the papers' SQuAD recipe,
or `--quick`'s CPU budget for either.

GLUE: one fixed space for every model compared (fairseq `examples/roberta/README.glue.md`): lr
{1e-5, 2e-5, 3e-5} x batch {16, 32}, 10 epochs, 6% warmup, weight decay 0.1, dropout 0.1,
five seeds, the median of the best setting reported. SQuAD (COCO-LM's and MAE-LM's): lr 2e-5,
batch 32, 3 epochs, 10% warmup, weight decay 0.01, dropout 0.1, five seeds; windows of 384
tokens (squad/features.py). `--quick` is a smoke budget a CPU runs in minutes on the demo's
export: one setting, one seed, 200 steps of 16 rows, with a learning rate a 4-layer model trains
at (1e-5 barely moves it in 300 steps); SQuAD's also caps its train windows.
"""

import dataclasses

from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning.training import RunSpec


@dataclasses.dataclass(frozen=True)
class Recipe:
    learning_rates: tuple[float, ...] = (1e-5, 2e-5, 3e-5)
    batch_sizes: tuple[int, ...] = (16, 32)
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    epochs: float = 10.0
    max_steps: int = 0  # a cap on every run's steps; 0: none
    warmup_ratio: float = 0.06
    weight_decay: float = 0.1
    dropout: float = 0.1
    attention_dropout: float = 0.1
    max_seq_length: int = 512  # cut to the export's own limit
    max_train_examples: int = 0  # a random subset of the train set per seed; 0: all

    def __post_init__(self):
        problems = []
        for name in ("learning_rates", "batch_sizes", "seeds"):
            if not getattr(self, name):
                problems.append(f"--{name} is empty; give at least one value")
        if any(lr <= 0 for lr in self.learning_rates):
            problems.append(f"--learning_rates={list(self.learning_rates)}: each must be > 0")
        if any(b < 1 for b in self.batch_sizes):
            problems.append(f"--batch_sizes={list(self.batch_sizes)}: each must be >= 1")
        if len(set(self.seeds)) != len(self.seeds):
            problems.append(f"--seeds={list(self.seeds)}: repeated seeds count one run twice")
        if not self.epochs > 0:
            problems.append(f"--epochs={self.epochs}: must be > 0")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"--warmup_ratio={self.warmup_ratio}: must be in [0, 1)")
        for name in ("dropout", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                problems.append(f"--{name}={getattr(self, name)}: must be in [0, 1)")
        if self.weight_decay < 0:
            problems.append(f"--weight_decay={self.weight_decay}: must be >= 0")
        for name in ("max_steps", "max_train_examples"):
            if getattr(self, name) < 0:
                problems.append(f"--{name}={getattr(self, name)}: must be >= 0 (0: no cap)")
        if self.max_seq_length < 8:
            problems.append(f"--max_seq_length={self.max_seq_length}: must be >= 8")
        if problems:
            raise ConfigError("; ".join(problems))

    def runs(self, task: str, init: str, max_seq_length: int) -> list[RunSpec]:
        """Every (setting, seed) run of one task, settings outermost."""
        return [
            RunSpec(
                task=task,
                init=init,
                learning_rate=lr,
                batch_size=bs,
                seed=seed,
                epochs=self.epochs,
                max_steps=self.max_steps,
                warmup_ratio=self.warmup_ratio,
                weight_decay=self.weight_decay,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                max_seq_length=min(self.max_seq_length, max_seq_length),
                max_train_examples=self.max_train_examples,
            )
            for lr in self.learning_rates
            for bs in self.batch_sizes
            for seed in self.seeds
        ]


ROBERTA = Recipe()
QUICK = Recipe(
    learning_rates=(1e-4,),
    batch_sizes=(16,),
    seeds=(1,),
    epochs=10.0,
    max_steps=200,
    max_seq_length=128,
)
SQUAD = Recipe(
    learning_rates=(2e-5,),
    batch_sizes=(32,),
    epochs=3.0,
    warmup_ratio=0.1,
    weight_decay=0.01,
    max_seq_length=384,  # the window; an export with fewer positions gets its own length
)
SQUAD_QUICK = dataclasses.replace(
    SQUAD, learning_rates=(1e-4,), batch_sizes=(16,), seeds=(1,), max_steps=200,
    max_train_examples=3200,
)  # fmt: skip
# Each family's recipe: the full one and --quick's.
RECIPES = {"glue": (ROBERTA, QUICK), "squad": (SQUAD, SQUAD_QUICK)}
