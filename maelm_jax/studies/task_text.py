"""The study's own corpus: the unlabeled text of its tasks' train splits, one document per
example.

A study config names it as `dataset = "study:task_text"` (`run_config.STUDY_TASK_TEXT`).
At the CPU study's scale the embedded Python-docs corpus teaches nothing GLUE asks about: its
export, fine-tuned for 150 steps, scored the same as random init on STS-B (Pearson 5.2
against 5.4; docs/results.md). Pretraining on the tasks' own sentences (task-adaptive
pretraining, Gururangan et al. 2020) gives every objective English it will be tested on, the
same text for all of them. Only train splits enter, and no label: dev sentences are never
seen before they are scored. A pair task's two sentences share one document, so pretraining
sees the pairs that fine-tuning reads; an exact repeat (SST-2's phrases recur) is written
once. SQuAD's train split gives each context once with its questions after it (the pair
fine-tuning reads); its answers are spans of the context, so no label enters either.
"""

import hashlib
import os

from maelm_jax.data.documents import TEXT_PREFIX
from maelm_jax.finetuning import search, squad_runs
from maelm_jax.glue import readers
from maelm_jax.squad import reading

CORPUS_DIR = "corpus"
CORPUS_FILE = "train.txt"


def dataset(study_dir: str) -> str:
    """The `text:` dataset the written corpus is read as."""
    return TEXT_PREFIX + os.path.join(os.path.abspath(study_dir), CORPUS_DIR, CORPUS_FILE)


def _document(example: readers.Example) -> str:
    parts = [example.text_a, example.text_b or ""]
    return "\n".join(" ".join(p.split()) for p in parts if p.strip())


def _documents(task, glue_dir: str | None):
    """The task's train split as documents: a GLUE example each, or a SQuAD context each,
    its questions following it in the order they come."""
    if search.family(task) != squad_runs.FAMILY:
        yield from (_document(e) for e in readers.read(task, "train", glue_dir))
        return
    questions: dict[str, list[str]] = {}  # context -> its questions; dicts keep the order
    for e in reading.read(task.version, "train", task.squad_dir, task.tfds_data_dir):
        questions.setdefault(" ".join(e.context.split()), []).append(" ".join(e.question.split()))
    for context, asked in questions.items():
        yield "\n".join(p for p in (context, *asked) if p)


def write(task_list, glue_dir: str | None, study_dir: str) -> dict:
    """Writes the corpus whole (a temporary file renamed into place), and what it holds."""
    out_dir = os.path.join(study_dir, CORPUS_DIR)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, CORPUS_FILE)
    seen: set[str] = set()
    per_task = {}
    digest = hashlib.sha256()
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for task in task_list:
            kept = 0
            for doc in _documents(task, glue_dir):
                if not doc or doc in seen:
                    continue
                seen.add(doc)
                kept += 1
                text = doc + "\n\n"
                digest.update(text.encode("utf-8"))
                f.write(text)
            per_task[task.name] = kept
    os.replace(tmp, path)
    return {
        "documents": len(seen),
        "documents_per_task": per_task,
        "words": sum(len(d.split()) for d in seen),
        "bytes": os.path.getsize(path),
        "sha256": digest.hexdigest(),
    }
