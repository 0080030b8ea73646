"""Answers from the start and end logits of every window, as COCO-LM's SQuAD code decodes.

Per window, the `n_best` highest start and end logits among the scoreable tokens pair up; a
pair is a candidate when both lie in the context, the end is not before the start, the span
is at most `max_answer_length` tokens, and the start token has its most context in this
window (features.py). A span scores start + end logit; the text is cut from the context by
the tokens' character spans. The null score is the least start[0] + end[0] over the
question's windows, and score_diff = null - the best candidate's score.

What a 2.0 prediction is: "" when score_diff > `null_threshold`, else the best text.
COCO-LM writes the best text always and lets the official evaluation call a question
unanswered where its null odds (score_diff) pass the na-prob threshold, 1.0; so the default
threshold is that 1.0, and `exact` and `f1` of predictions.json with null_odds.json are the
papers' numbers (HuggingFace's `run_qa.py` uses 0.0).
"""

from collections.abc import Sequence

import numpy as np

from maelm_jax.squad.features import Features
from maelm_jax.squad.reading import Example
from maelm_jax.squad.scoring import NA_PROB_THRESH

N_BEST = 20
MAX_ANSWER_LENGTH = 30


def decode(
    examples: Sequence[Example],
    features: Features,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    with_null: bool,
    n_best: int = N_BEST,
    max_answer_length: int = MAX_ANSWER_LENGTH,
    null_threshold: float = NA_PROB_THRESH,
) -> tuple[dict[str, str], dict[str, float]]:
    """({question id: answer text}, {question id: score_diff}) for every example; the second
    is empty unless `with_null` (SQuAD 2.0). Logits are [windows, seq_len], in `features`'
    order; a question with no candidate span answers "" with a non-null score of 0."""
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    if start_logits.shape != features.input_ids.shape or end_logits.shape != start_logits.shape:
        raise ValueError(
            f"logits of shapes {start_logits.shape} and {end_logits.shape}; the features' "
            f"windows are {features.input_ids.shape}"
        )
    windows_of = [[] for _ in examples]
    for w, index in enumerate(features.example_index):
        windows_of[index].append(w)
    predictions, null_odds = {}, {}
    for example, windows in zip(examples, windows_of, strict=True):
        null = min((start_logits[w, 0] + end_logits[w, 0] for w in windows), default=0.0)
        score, text = 0.0, ""
        best = None
        for w in windows:
            found = _best_span(
                features, w, start_logits[w], end_logits[w], n_best, max_answer_length
            )
            if found is not None and (best is None or found[0] > best[0]):
                best = (*found, w)
        if best is not None:
            score, first, last, w = best
            start, _ = features.char_span(w, first)
            _, end = features.char_span(w, last)
            text = example.context[start:end].strip()
        if with_null:
            diff = float(null - score)
            null_odds[example.id] = diff
            predictions[example.id] = "" if diff > null_threshold else text
        else:
            predictions[example.id] = text
    return predictions, null_odds


def _best_span(
    features: Features,
    w: int,
    start: np.ndarray,
    end: np.ndarray,
    n_best: int,
    max_answer_length: int,
) -> tuple[float, int, int] | None:
    """(score, first, last) of window `w`'s best candidate, or None. Of equal scores, the one
    COCO-LM's stable sort puts first wins: starts, then ends, in the order of `_top`."""
    scoreable = features.scoreable[w]
    starts = _top(start, scoreable, n_best)
    ends = _top(end, scoreable, n_best)
    ok = (  # an end at or after a start in the context is in the context too, or past it
        features.max_context[w, starts][:, None]
        & scoreable[ends][None, :]
        & (ends[None, :] >= starts[:, None])
        & (ends[None, :] - starts[:, None] + 1 <= max_answer_length)
    )
    if not ok.any():
        return None
    scores = np.where(ok, start[starts][:, None] + end[ends][None, :], -np.inf)
    i, j = np.unravel_index(np.argmax(scores), scores.shape)
    return float(scores[i, j]), int(starts[i]), int(ends[j])


def _top(logits: np.ndarray, scoreable: np.ndarray, n: int) -> np.ndarray:
    """The positions of the `n` highest scoreable logits, highest first, earlier on ties."""
    positions = np.flatnonzero(scoreable)
    order = np.argsort(-logits[positions], kind="stable")[:n]
    return positions[order]
