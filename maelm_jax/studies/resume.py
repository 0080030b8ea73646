"""A study folder copied to a fresh machine: which finished stages must be done again because
an unfinished one needs what they made, and what the copy lacks.

A marker says a stage finished, not that what it made is still there. A copy between
machines holds what is small (the corpus, spec.json, the markers, the fine-tuning searches)
and not the pretraining checkpoints or the exports. An unfinished fine-tuning needs its
export (the random-init row the first objective's: its architecture and tokenizer); an
unfinished rank, or an export to remake, needs the final checkpoint; a pretraining to redo
needs the corpus. Each such stage loses its marker, with the reason logged, and
`stages.once` does it again; nothing else is redone. A fine-tuning search keeps its finished
runs, and takes them only for the same export byte for byte, at the same path
(glue/search.py): `check_search` says so in the study's words before the search refuses.
"""

import json
import os

from absl import logging

from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError
from maelm_jax.glue import search
from maelm_jax.studies import task_text
from maelm_jax.studies.plan import RANDOM_ROW, Study, marker


def _has_export(export_dir: str) -> bool:
    return all(
        os.path.isfile(os.path.join(export_dir, f)) for f in ("config.json", "model.safetensors")
    )


def _has_checkpoint(workdir: str, step: int) -> bool:
    """A usable checkpoint of the last step (one killed midway is not one)."""
    from maelm_jax.inspection import trained_model

    try:
        trained_model.step_dir_of(workdir, step)
    except ConfigError:
        return False
    return True


def stale(study: Study, study_dir: str) -> list[tuple[str, str, str]]:
    """(row, stage, why) for every finished stage to do again, in the order they run."""

    def done(row: str, stage: str) -> bool:
        return os.path.isfile(marker(study_dir, row, stage))

    out = []
    first = next(iter(study.configs))
    for name, config in study.configs.items():
        export_dir, workdir = study.export_dir(study_dir, name), study.workdir(study_dir, name)
        need_export = [f"{name}/finetune"] if not done(name, "finetune") else []
        if name == first and not done(RANDOM_ROW, "finetune"):
            need_export.append(f"{RANDOM_ROW}/finetune")
        remake_export = bool(need_export) and not _has_export(export_dir)
        export_runs = remake_export or not done(name, "export")
        need_checkpoint = [f"{name}/export"] if export_runs and not _has_export(export_dir) else []
        need_checkpoint += [f"{name}/rank"] if not done(name, "rank") else []
        steps = config.num_train_steps
        if need_checkpoint and done(name, "pretrain") and not _has_checkpoint(workdir, steps):
            why = f"{workdir} holds no checkpoint of step {steps}; {_needs(need_checkpoint)} it"
            out.append((name, "pretrain", why))
        if remake_export and done(name, "export"):
            out.append((name, "export", f"{export_dir} is gone; {_needs(need_export)} it"))
    corpus = os.path.join(study_dir, task_text.CORPUS_DIR, task_text.CORPUS_FILE)
    pretrain = [f"{n}/pretrain" for n in study.configs if not done(n, "pretrain")]
    pretrain += [f"{r}/{s}" for r, s, _ in out if s == "pretrain"]
    uses_corpus = next(iter(study.configs.values())).dataset == STUDY_TASK_TEXT
    corpus_done = done(task_text.CORPUS_DIR, "task_text")
    if uses_corpus and pretrain and corpus_done and not os.path.isfile(corpus):
        out.insert(
            0, (task_text.CORPUS_DIR, "task_text", f"{corpus} is gone; {_needs(pretrain)} it")
        )
    return out


def _needs(stages: list[str]) -> str:
    return " and ".join(stages) + (" need" if len(stages) > 1 else " needs")


def reopen(study: Study, study_dir: str) -> list[tuple[str, str, str]]:
    """Removes the marker of every `stale` stage, so that it runs again; on process 0, before
    anything runs (a pretraining to redo must also see the data order checked)."""
    found = stale(study, study_dir)
    for row, stage, why in found:
        logging.info("study: %s/%s is done again: %s", row, stage, why)
        os.remove(marker(study_dir, row, stage))
    return found


def check_search(row: str, export_dir: str, search_dir: str) -> None:
    """Refuses, in the study's words, to go on with a search whose finished runs fine-tuned
    another export than the one now in `export_dir` (remade from a pretraining done again,
    which need not be bit-exact: a CPU's was, a GPU's is not promised), or the same one at
    another path (the study folder moved)."""
    spec_path = os.path.join(search_dir, search.SPEC_FILE)
    if not os.path.isfile(spec_path):
        return
    with open(spec_path) as f:
        was = json.load(f).get("export", {})
    now = search.export_identity(export_dir)
    runs_dir = os.path.join(search_dir, "runs")
    runs = len(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else 0
    if was.get("path") not in (None, now["path"]):
        raise ConfigError(
            f"{row}: its fine-tuning search ({runs} finished run(s)) fine-tuned the export at "
            f"{was['path']}, and this study folder's is at {now['path']}: a copied study "
            "resumes at the path it ran at"
        )
    if was.get("model.safetensors") not in (None, now["model.safetensors"]):
        raise ConfigError(
            f"{row}: its fine-tuning search's {runs} finished run(s) fine-tuned another "
            f"export than the one remade in {export_dir} (pretraining done again is not "
            f"bit-exact here); copy that export from the machine it ran on, or delete "
            f"{search_dir} to fine-tune this one afresh"
        )
