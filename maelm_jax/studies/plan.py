"""What a study is: its objectives (config files), tasks and recipe, fixed in spec.json.

A study directory belongs to one spec. Rerunning with the same spec goes on where the last run
stopped; another config, task list or recipe is refused by name, so old and new results are
never mixed. Every config's data keys must agree, so all objectives read one tokenizer and
one corpus in one order (the same seed, batch and steps).
"""

import ast
import dataclasses
import json
import os

import ml_collections

from maelm_jax.config.run_config import ConfigError
from maelm_jax.finetuning import recipe as recipes
from maelm_jax.finetuning import search, squad_runs
from maelm_jax.finetuning.recipe import Recipe
from maelm_jax.finetuning.search import write_json
from maelm_jax.glue import tasks as glue_tasks
from maelm_jax.squad import features, reading
from maelm_jax.studies.task_text import CORPUS_DIR

SPEC_FILE = "spec.json"
RANDOM_ROW = "random_init"
# Keys that must be equal across a study's configs: the data, its order and the budget.
SHARED_KEYS = (
    "dataset", "data_dir", "vocab_size", "vocab_path", "seq_len", "batch_size",
    "num_train_steps", "seed", "packing", "eval_holdout_fraction",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Study:
    configs: dict[str, ml_collections.ConfigDict]  # name (the file's stem) -> config
    tasks: tuple  # GLUE's (glue_tasks.Task) and SQuAD's (squad_runs.SquadTask), in order
    recipe: Recipe
    glue_dir: str | None
    rank_tokens: int
    workdir_root: str | None = None  # the objectives' pretraining workdirs; None: in the study
    squad_dir: str | None = None  # None: TFDS's, where a SQuAD task is asked

    @property
    def squad_tasks(self) -> list:
        return [t for t in self.tasks if search.family(t) == squad_runs.FAMILY]

    def spec(self) -> dict:
        spec = {
            "configs": {n: json.loads(c.to_json_best_effort()) for n, c in self.configs.items()},
            "tasks": [t.name for t in self.tasks],
            "recipe": dataclasses.asdict(self.recipe),
            "data": os.path.abspath(self.glue_dir) if self.glue_dir else "tfds",
            "rank_tokens": self.rank_tokens,
        }
        if self.workdir_root:  # absent by default: the specs of earlier studies still match
            spec["workdir_root"] = self.workdir_root
        if self.squad_tasks:  # likewise absent from a GLUE-only study's spec
            spec["squad_data"] = os.path.abspath(self.squad_dir) if self.squad_dir else "tfds"
        return spec

    def workdir(self, study_dir: str, name: str) -> str:
        """Where objective `name` pretrains: `<study_dir>/<name>/workdir`, or `<root>/<name>`
        (`--workdir_root`, e.g. a gs:// bucket a pod's hosts all write their shards to)."""
        if self.workdir_root:
            return f"{self.workdir_root}/{name}"  # no trailing "/": `workdir_root` strips it
        return os.path.join(study_dir, name, "workdir")

    @staticmethod
    def export_dir(study_dir: str, name: str) -> str:
        return os.path.join(study_dir, name, "export")


def resolve_tasks(names: str, recipe: Recipe, squad_dir: str | None) -> tuple:
    """`--tasks` in order: GLUE's tasks, and SQuAD's with SQuAD's recipe (recipe.SQUAD: its
    warmup, weight decay, epochs and windows of the export's length) under the study's grid
    and budget (learning rates, batch sizes, seeds, max_steps), as every row shares them."""
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        version = reading.VERSIONS.get(name.lower())
        if version is None:
            if name.lower().replace("-", "") not in glue_tasks.TASKS:
                allowed = ", ".join([*glue_tasks.TASKS, *reading.VERSIONS])
                raise ConfigError(
                    f"--tasks: unknown task {name!r}; allowed: {allowed} (WNLI is left out, "
                    "as the papers leave it out)"
                )
            chosen += glue_tasks.resolve([name])
            continue
        squad = dataclasses.replace(
            recipes.SQUAD,
            learning_rates=recipe.learning_rates,
            batch_sizes=recipe.batch_sizes,
            seeds=recipe.seeds,
            max_steps=recipe.max_steps,
        )
        chosen.append(squad_runs.SquadTask(version, squad, squad_dir=squad_dir))
    if not chosen:
        raise ConfigError(f"--tasks: no task given; allowed: {', '.join(glue_tasks.TASKS)}")
    if squad_dir is not None and not any(search.family(t) == squad_runs.FAMILY for t in chosen):
        raise ConfigError(
            f"--squad_dir={squad_dir} goes with --tasks=...,squad_v2 or squad_v1 (--tasks={names})"
        )
    return tuple({t.name: t for t in chosen}.values())


def check_data(study: Study) -> None:
    """Every task's train and dev data read and checked, so that bad or missing data is
    refused in one line before anything is pretrained."""
    glue = [t for t in study.tasks if search.family(t) != squad_runs.FAMILY]
    search.load_data(glue, study.glue_dir, None)
    for task in study.squad_tasks:
        for split in reading.SPLITS:
            reading.read(task.version, split, task.squad_dir, task.tfds_data_dir)
    least = features.MAX_QUERY_LENGTH + features.SPECIAL_TOKENS + 1
    for name, config in study.configs.items() if study.squad_tasks else ():
        positions = config.model.max_positions  # the export's, which cut SQuAD's windows
        if positions < least:
            raise ConfigError(
                f"--configs: {name} has model.max_positions={positions}; SQuAD's windows need "
                f"at least {least} (a question of up to {features.MAX_QUERY_LENGTH} tokens, "
                f"{features.SPECIAL_TOKENS} special tokens and some context)"
            )


def marker(study_dir: str, row: str, stage: str) -> str:
    """Where a finished stage leaves its measurements (`stages.once`)."""
    return os.path.join(study_dir, row, f"{stage}.json")


def with_overrides(configs: dict, overrides: dict[str, str]) -> dict:
    """{name: ConfigDict} with the study-wide `key=value` overrides applied to each, checked
    to share `SHARED_KEYS`."""
    for reserved, what in ((RANDOM_ROW, "the random-init row"), (CORPUS_DIR, "the corpus")):
        if reserved in configs:
            raise ConfigError(f"--configs: {reserved!r} names {what}'s folder; rename the file")
    for path, config in configs.items():
        for key, value in overrides.items():
            node = config
            *parents, leaf = key.split(".")
            for parent in parents:
                node = node[parent]
            if leaf not in node:
                raise ConfigError(f"--overrides {key}: the config {path} has no such key")
            node[leaf] = _typed(value, node[leaf], key)
    first_name, first = next(iter(configs.items()))
    for name, config in configs.items():
        differ = [k for k in SHARED_KEYS if config.get(k) != first.get(k)]
        if differ:
            raise ConfigError(
                f"--configs: {name} and {first_name} differ in {', '.join(differ)}; a study's "
                "objectives share one corpus, tokenizer, batch, step count and data order"
            )
    return configs


def _typed(text: str, current, key: str):
    """`text` as a Python literal of the key's type (`8`, `0.5`, `True`, `'c4/en'`)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # a bare string
    if current is not None and not isinstance(value, type(current)):
        if isinstance(current, float) and isinstance(value, int):
            return float(value)
        raise ConfigError(
            f"--overrides {key}={text}: takes a {type(current).__name__} (now {current!r})"
        )
    return value


def check_study_dir(study_dir: str) -> None:
    """A study lives in one local folder: its stage markers and spec are local files, and
    transformers fine-tunes an export read from disk. A URL (`gs://...`) would have become a
    local folder named `gs:` on every host, so it is refused; a bucket mounted as a folder
    (gcsfuse) is a local path."""
    scheme, sep, _ = study_dir.partition("://")
    if sep:
        raise ConfigError(
            f"--study_dir={study_dir}: a study lives in a local folder ({scheme}:// is not "
            "one); give a local path or a mount (NFS, gcsfuse), and --workdir_root=gs://... "
            "to put the pretraining checkpoints in the bucket"
        )


def workdir_root(value: str | None) -> str | None:
    """`--workdir_root` as the spec keeps it: a local folder made absolute, or a gs:// URL
    (Orbax and the export read both)."""
    if not value:
        return None
    scheme, sep, _ = value.partition("://")
    if not sep:
        return os.path.abspath(value)
    if scheme != "gs":
        raise ConfigError(f"--workdir_root={value}: give a local folder or a gs:// URL")
    return value.rstrip("/")


def claim(study_dir: str, study: Study) -> None:
    """Writes spec.json into a new study directory, or checks it against the one there."""
    path = os.path.join(study_dir, SPEC_FILE)
    spec = json.loads(json.dumps(study.spec()))  # as it reads back: tuples are lists
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        if old != spec:
            raise ConfigError(
                f"--study_dir={study_dir} holds a study with another {_difference(old, spec)}; "
                "give a new --study_dir (a study's results are never mixed)"
            )
        return
    if os.path.isdir(study_dir) and os.listdir(study_dir):
        raise ConfigError(
            f"--study_dir={study_dir} exists, is not empty and holds no {SPEC_FILE}; give a "
            "new or empty folder"
        )
    os.makedirs(study_dir, exist_ok=True)
    write_json(path, spec)


def _difference(old: dict, new: dict) -> str:
    """The first thing that changed, named: a config (and its first changed key), or a key."""
    if old.get("configs", {}).keys() != new["configs"].keys():
        return f"set of configs ({', '.join(old.get('configs', {}))})"
    for name, config in new["configs"].items():
        changed = _changed_keys(old["configs"][name], config)
        if changed:
            return f"config {name!r} ({', '.join(changed[:3])} changed)"
    keys = [k for k in new if old.get(k) != new[k]]
    return " and ".join(f"{k} (was {old.get(k)!r})" for k in keys)


def _changed_keys(old, new, prefix="") -> list[str]:
    out = []
    for k in sorted(old.keys() | new.keys()):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed_keys(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return out
