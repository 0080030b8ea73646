"""The files a SQuAD user expects in a run's folder, named as the official tools name them:
predictions.json (question id -> answer text, "" for no answer), null_odds.json (id ->
score_diff, 2.0 only; the official script's `--na-prob-file`) and eval.json, the official
evaluation's output computed from those two files as written, so it is what
`evaluate-v2.0.py dev-v2.0.json predictions.json --na-prob-file null_odds.json` prints.
"""

import json
import os
import pathlib
from collections.abc import Sequence

from maelm_jax.squad import scoring
from maelm_jax.squad.reading import Example, Version

PREDICTIONS = "predictions.json"
NULL_ODDS = "null_odds.json"
EVAL = "eval.json"


def write(
    run_dir: str | os.PathLike,
    version: Version,
    examples: Sequence[Example],
    predictions: dict[str, str],
    null_odds: dict[str, float],
) -> dict:
    """Writes the three files (two for 1.1) and returns eval.json's contents. Every question
    of `examples` must have a prediction, and for 2.0 its null odds."""
    needed = [predictions] + ([null_odds] if version.with_null else [])
    missing = [e.id for e in examples if any(e.id not in d for d in needed)]
    if missing:
        raise ValueError(
            f"{len(missing)} of {len(examples)} questions have no prediction "
            f"(the first: {missing[0]!r}); every dev question is scored"
        )
    run_dir = pathlib.Path(run_dir)
    _write_json(run_dir / PREDICTIONS, {e.id: predictions[e.id] for e in examples})
    if version.with_null:
        _write_json(run_dir / NULL_ODDS, {e.id: null_odds[e.id] for e in examples})
    result = evaluate_files(run_dir, version, examples)
    _write_json(run_dir / EVAL, result)
    return result


def evaluate_files(run_dir: str | os.PathLike, version: Version, examples: Sequence[Example]):
    """The official evaluation of `run_dir`'s predictions.json (and null_odds.json for 2.0)."""
    run_dir = pathlib.Path(run_dir)
    predictions = json.loads((run_dir / PREDICTIONS).read_text(encoding="utf-8"))
    if not version.with_null:
        return scoring.evaluate_v1(examples, predictions)
    null_odds = json.loads((run_dir / NULL_ODDS).read_text(encoding="utf-8"))
    return scoring.evaluate_v2(examples, predictions, null_odds)


def _write_json(path: pathlib.Path, value) -> None:
    """Whole or not at all: a killed write leaves no file a later run would trust."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
