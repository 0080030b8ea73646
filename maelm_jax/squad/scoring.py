"""The official SQuAD evaluations' rules (evaluate-v2.0.py and evaluate-v1.1.py), restated.

2.0: answers are normalized (lowercase, punctuation stripped, a/an/the dropped, whitespace
collapsed); EM and token F1 are each the best over the gold answers, of which those that
normalize to nothing are dropped and `[""]` stands in when none remain. A question whose
na-prob (here its null odds, score_diff) is above the threshold, 1.0, counts as answered
"no answer". `best_exact` and `best_f1` are the scores at the threshold on the na-probs that
would have done best, given with it. A question without a prediction is left out of 2.0's
totals, as the official script does. 1.1 reports EM and F1 only, each the best over all gold
answers with no special case for empty ones, and a missing prediction counts 0.
"""

import collections
import re
import string
from collections.abc import Sequence

from maelm_jax.squad.reading import Example

NA_PROB_THRESH = 1.0
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1(gold: str, prediction: str) -> float:
    """2.0's token F1: an empty answer on either side scores 1 if both are empty, else 0."""
    gold_tokens = normalize_answer(gold).split() if gold else []
    predicted = normalize_answer(prediction).split() if prediction else []
    if not gold_tokens or not predicted:
        return float(gold_tokens == predicted)
    return _f1(gold_tokens, predicted)


def evaluate_v2(
    examples: Sequence[Example],
    predictions: dict[str, str],
    na_probs: dict[str, float] | None = None,
    na_prob_thresh: float = NA_PROB_THRESH,
) -> dict[str, float | int]:
    """evaluate-v2.0.py's output for `predictions` (and, when given, its na-prob file)."""
    has_answer = {e.id: e.has_answer for e in examples}
    exact_raw, f1_raw = {}, {}
    for e in examples:
        if e.id not in predictions:
            continue
        golds = [a.text for a in e.answers if normalize_answer(a.text)] or [""]
        exact_raw[e.id] = max(exact(g, predictions[e.id]) for g in golds)
        f1_raw[e.id] = max(f1(g, predictions[e.id]) for g in golds)
    probs = {k: 0.0 for k in predictions} if na_probs is None else na_probs
    exact_thresh = _apply_no_answer_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1_thresh = _apply_no_answer_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    result = _eval_dict(exact_thresh, f1_thresh)
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [k for k, v in has_answer.items() if v == wanted]
        if ids:
            part = _eval_dict(exact_thresh, f1_thresh, ids)
            result.update({f"{prefix}_{k}": v for k, v in part.items()})
    if na_probs is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            best, thresh = _best_threshold(predictions, raw, na_probs, has_answer)
            result[f"best_{name}"] = best
            result[f"best_{name}_thresh"] = thresh
    return result


def evaluate_v1(examples: Sequence[Example], predictions: dict[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py's output: {"exact_match", "f1"}, over every question."""
    matched = score = 0.0
    for e in examples:
        if e.id not in predictions:
            continue
        golds = [a.text for a in e.answers]
        prediction = predictions[e.id]
        matched += max(normalize_answer(prediction) == normalize_answer(g) for g in golds)
        score += max(
            _f1(normalize_answer(g).split(), normalize_answer(prediction).split()) for g in golds
        )
    return {"exact_match": 100.0 * matched / len(examples), "f1": 100.0 * score / len(examples)}


def _f1(gold_tokens: list[str], predicted: list[str]) -> float:
    same = sum((collections.Counter(gold_tokens) & collections.Counter(predicted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _apply_no_answer_threshold(scores, na_probs, has_answer, thresh) -> dict[str, float]:
    return {k: float(not has_answer[k]) if na_probs[k] > thresh else s for k, s in scores.items()}


def _eval_dict(exact_scores, f1_scores, ids=None) -> dict[str, float | int]:
    ids = ids or list(exact_scores)
    return {
        "exact": 100.0 * sum(exact_scores[k] for k in ids) / len(ids),
        "f1": 100.0 * sum(f1_scores[k] for k in ids) / len(ids),
        "total": len(ids),
    }


def _best_threshold(predictions, scores, na_probs, has_answer) -> tuple[float, float]:
    """Sweeping the threshold up through the na-probs, lowest first: each question passed
    turns from "no answer" into its prediction. Starts from every question unanswered."""
    current = best = sum(1 for v in has_answer.values() if not v)
    thresh = 0.0
    for k in sorted(na_probs, key=lambda k: na_probs[k]):
        if k not in scores:
            continue
        if has_answer[k]:
            current += scores[k]
        elif predictions[k]:
            current -= 1
        if current > best:
            best, thresh = current, na_probs[k]
    return 100.0 * best / len(scores), thresh
