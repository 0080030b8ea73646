"""A study folder copied to a fresh machine, or moved: which finished stages must be done again
because an unfinished one needs what they made, and what the copy lacks.

A marker says a stage finished, not that what it made is still there. A copy between
machines holds what is small (the corpus, spec.json, the markers, the fine-tuning searches)
and not the pretraining checkpoints or the exports. An unfinished fine-tuning needs its
export (the random-init row the first objective's: its architecture and tokenizer); an
unfinished rank, or an export to remake, needs the final checkpoint; a pretraining to redo
needs the corpus. Each such stage loses its marker, with the reason logged, and
`stages.once` does it again.

A pretraining that runs again makes another model (a GPU's rerun is not bit-exact), so what
the row made from the old one goes with it: its export and fine-tuning search are moved
aside (`<folder>.stale-<time>`, not deleted: the old export is the only copy left of the old
model, and its runs took hours) and its rank is measured again; no row reports one model's
GLUE beside another's loss. The search is taken back when the new export is the old one
byte for byte (a CPU's rerun is), so its finished runs are kept. The random-init row stays:
it takes the export's architecture and tokenizer, not its weights.

A search names its export by absolute path (finetuning/search.py). A study folder that moved (its
export at `<row>/export` under the new root, the same bytes) resumes: `check_search` points
the search at the new path; another export's bytes are refused in the study's words.
"""

import glob
import json
import os
import time

from absl import logging

from maelm_jax.config.run_config import STUDY_TASK_TEXT, ConfigError
from maelm_jax.finetuning import search
from maelm_jax.studies import task_text
from maelm_jax.studies.plan import RANDOM_ROW, Study, marker

STALE = ".stale-"  # `<folder>.stale-<time>`: what a pretraining done again made obsolete
_BYTES = ("model.safetensors", "config.json")  # export_identity's keys that are the model


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


def _search_dir(study_dir: str, row: str) -> str:
    return os.path.join(study_dir, row, "finetune")


def stale(study: Study, study_dir: str) -> list[tuple[str, str, str]]:
    """(row, stage, why) for every stage to do again whose marker or output is there, in
    the order they run."""

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
        redo = bool(need_checkpoint) and done(name, "pretrain")
        redo = redo and not _has_checkpoint(workdir, steps)
        if redo:
            why = f"{workdir} holds no checkpoint of step {steps}; {_needs(need_checkpoint)} it"
            out.append((name, "pretrain", why))
        if remake_export and done(name, "export"):
            out.append((name, "export", f"{export_dir} is gone; {_needs(need_export)} it"))
        if redo or not done(name, "pretrain"):
            old = _made_before(name, export_dir, _search_dir(study_dir, name), done)
            out += [o for o in old if o[:2] not in {r[:2] for r in out}]
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


def _made_before(name: str, export_dir: str, runs_dir: str, done) -> list[tuple[str, str, str]]:
    """The row's export, search and rank that the pretraining about to run makes obsolete."""
    old = f"made from the {name} model whose checkpoint is gone"
    out = []
    if os.path.isdir(export_dir):
        out.append((name, "export", f"{export_dir} was {old}"))
    if os.path.isdir(runs_dir) or done(name, "finetune"):
        out.append((name, "finetune", f"{runs_dir} fine-tuned the export {old}"))
    if done(name, "rank"):
        out.append((name, "rank", f"it measured the {name} model whose checkpoint is gone"))
    return out


def _needs(stages: list[str]) -> str:
    return " and ".join(stages) + (" need" if len(stages) > 1 else " needs")


def reopen(study: Study, study_dir: str) -> list[tuple[str, str, str]]:
    """Removes the marker of every `stale` stage, so that it runs again, and moves aside the
    export and search a pretraining done again makes obsolete; on process 0, before anything
    runs (a pretraining to redo must also see the data order checked). The pretraining's
    marker goes last: a reopen killed midway leaves a row whose pretraining still runs, and
    the next one finds what it made."""
    found = stale(study, study_dir)
    lines = []
    for row, stage, why in reversed(found):
        folder = {"export": study.export_dir(study_dir, row)}
        folder["finetune"] = _search_dir(study_dir, row)
        if stage in folder and os.path.isdir(folder[stage]):
            why += f"; the old one is kept as {_move_aside(folder[stage])}"
        path = marker(study_dir, row, stage)
        if os.path.isfile(path):
            os.remove(path)
        lines.append((row, stage, why))
    for row, stage, why in reversed(lines):
        logging.info("study: %s/%s is done again: %s", row, stage, why)
    return found


def _move_aside(folder: str) -> str:
    dest = base = f"{folder}{STALE}{time.strftime('%Y%m%d-%H%M%S')}"
    n = 0
    while os.path.exists(dest):
        n += 1
        dest = f"{base}-{n}"
    os.rename(folder, dest)
    return dest


def _spec(folder: str) -> dict | None:
    path = os.path.join(folder, search.SPEC_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _take_back(row: str, folder: str, now: dict) -> None:
    """Puts back the newest search moved aside whose runs fine-tuned this export byte for
    byte: the pretraining done again made the same model, so its runs stand."""
    if os.path.exists(folder):
        return
    for old in sorted(glob.glob(glob.escape(folder) + STALE + "*"), reverse=True):
        was = (_spec(old) or {}).get("export", {})
        if all(was.get(k) == now[k] for k in _BYTES):
            os.rename(old, folder)
            logging.info(
                "study: %s/finetune takes back %s: the pretraining done again made the same "
                "export byte for byte, so its %d finished run(s) stand",
                row, old, _count_runs(folder),
            )  # fmt: skip
            return


def _count_runs(folder: str) -> int:
    runs_dir = os.path.join(folder, "runs")
    return len(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else 0


def check_search(row: str, export_dir: str, search_dir: str) -> None:
    """Before a row's search: takes back a search moved aside for this very export, points a
    search of a moved study folder at the export's new path, and refuses, in the study's
    words, a search whose finished runs fine-tuned other export bytes than those now in
    `export_dir` (remade from a pretraining done again, which need not be bit-exact: a CPU's
    was, a GPU's is not promised)."""
    now = search.export_identity(export_dir)
    _take_back(row, search_dir, now)
    spec = _spec(search_dir)
    if spec is None:
        return
    was = spec.get("export", {})
    runs = _count_runs(search_dir)
    if any(was.get(k) not in (None, now[k]) for k in _BYTES):
        raise ConfigError(
            f"{row}: its fine-tuning search's {runs} finished run(s) fine-tuned another "
            f"export than the one remade in {export_dir} (pretraining done again is not "
            f"bit-exact here); copy that export from the machine it ran on, or delete "
            f"{search_dir} to fine-tune this one afresh"
        )
    if was.get("path") in (None, now["path"]):
        return
    # The same bytes elsewhere: the study folder moved if the export sits at the same place
    # under the new root (`<study>/<row>/finetune` -> `<study>/<first>/export`).
    root = os.path.dirname(os.path.dirname(os.path.abspath(search_dir)))
    inside = os.path.relpath(now["path"], root)
    if inside.startswith(os.pardir) or not was["path"].endswith(os.sep + inside):
        raise ConfigError(
            f"{row}: its fine-tuning search ({runs} finished run(s)) fine-tuned the export at "
            f"{was['path']}, and this study folder's is at {now['path']}, not the same place "
            f"in a moved folder; delete {search_dir} to fine-tune this one afresh"
        )
    logging.info(
        "study: %s/finetune: the study folder moved from %s; its search now names the "
        "same export at %s",
        row, was["path"][: -len(inside) - 1], now["path"],
    )  # fmt: skip
    search.write_json(os.path.join(search_dir, search.SPEC_FILE), {**spec, "export": now})
