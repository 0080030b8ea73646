"""SQuAD's questions as the papers feed them: `<s> question </s></s> context </s>` windows.

As in COCO-LM's (and BERT's) SQuAD code, only the context is cut: the question keeps its first
`max_query_length` tokens, and the context is split into windows of what is left, each
starting `doc_stride` tokens after the last (BERT's meaning of the stride: the step between
windows, not HuggingFace's overlap). Each context is tokenized once, alone, through the
export's fast tokenizer, so every token has its character span (`return_offsets_mapping`);
encoding the context alone gives the tokens a pair would, since a pair's sequences are
pre-tokenized apart. Span labels come from those character spans: the first token ending
after the answer's first character and the last token starting before its end. A question
with no answer, or a window that does not hold the whole answer, points at index 0 (`<s>`).
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import logging

from maelm_jax.config.run_config import ConfigError
from maelm_jax.squad.reading import Example

SEQ_LEN = 384
DOC_STRIDE = 128
MAX_QUERY_LENGTH = 64
SPECIAL_TOKENS = 4  # <s>, </s></s> between question and context, </s> at the end


@dataclasses.dataclass(frozen=True)
class Features:
    """Every window of every question, padded to `seq_len` ([windows, seq_len] arrays)."""

    input_ids: np.ndarray  # [windows, seq_len] int32, the tokenizer's pad id after the end
    attention_mask: np.ndarray  # [windows, seq_len] int32, 1 on tokens
    start_positions: np.ndarray  # [windows] int32; 0 (`<s>`) where the window holds no answer
    end_positions: np.ndarray  # [windows] int32
    scoreable: np.ndarray  # [windows, seq_len] bool: index 0 and the context's tokens
    max_context: np.ndarray  # [windows, seq_len] bool: context tokens with most context here
    example_index: np.ndarray  # [windows] int32, into the examples they were built from
    context_offset: np.ndarray  # [windows] int32, the position of the first context token
    window_start: np.ndarray  # [windows] int32, that token's index in its context's tokens
    spans: tuple[np.ndarray, ...]  # per example, [context tokens, 2]: characters [start, end)

    def __len__(self) -> int:
        return len(self.example_index)

    def char_span(self, window: int, position: int) -> tuple[int, int]:
        """Characters [start, end) of the context that the context token at `position` of
        `window` covers."""
        token = self.window_start[window] + position - self.context_offset[window]
        start, end = self.spans[self.example_index[window]][token]
        return int(start), int(end)


def window_shape(
    max_positions: int,
    max_seq_length: int | None = None,
    doc_stride: int | None = None,
    max_query_length: int = MAX_QUERY_LENGTH,
) -> tuple[int, int]:
    """(seq_len, doc_stride): SQuAD's 384 and 128, or, for an export with fewer positions,
    windows of its own length with the stride scaled by the same ratio. `max_seq_length` and
    `doc_stride` override both."""
    seq_len = min(SEQ_LEN, max_positions) if max_seq_length is None else max_seq_length
    stride = max(1, round(DOC_STRIDE * seq_len / SEQ_LEN)) if doc_stride is None else doc_stride
    if max_seq_length is None and max_positions < SEQ_LEN:
        logging.info(
            "SQuAD: the export has %d positions, fewer than SQuAD's %d: windows of %d tokens, "
            "doc_stride %d (%d scaled); --max_seq_length and --doc_stride override",
            max_positions,
            SEQ_LEN,
            seq_len,
            stride,
            DOC_STRIDE,
        )
    if seq_len > max_positions:
        raise ConfigError(
            f"max_seq_length={seq_len} is more than the export's {max_positions} positions"
        )
    least = max_query_length + SPECIAL_TOKENS + 1
    if seq_len < least:
        raise ConfigError(
            f"max_seq_length={seq_len} leaves no context after a question of up to "
            f"max_query_length={max_query_length} tokens and {SPECIAL_TOKENS} special tokens; "
            f"allowed: at least {least}"
        )
    if stride < 1:
        raise ConfigError(f"doc_stride={stride}: the step between windows must be at least 1")
    return seq_len, stride


def build(
    examples: Sequence[Example],
    tokenizer,
    seq_len: int = SEQ_LEN,
    doc_stride: int = DOC_STRIDE,
    max_query_length: int = MAX_QUERY_LENGTH,
) -> Features:
    """The windows of `examples` through `tokenizer`, a `PreTrainedTokenizerFast`."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; SQuAD's span labels need "
            "its character offsets (an export with tokenizer.json loads as one)"
        )
    contexts = list(dict.fromkeys(e.context for e in examples))
    encoded = tokenizer(contexts, add_special_tokens=False, return_offsets_mapping=True)
    by_context = {
        c: (np.asarray(ids, np.int32), np.asarray(offsets, np.int32).reshape(-1, 2))
        for c, ids, offsets in zip(
            contexts, encoded["input_ids"], encoded["offset_mapping"], strict=True
        )
    }
    questions = tokenizer([e.question.lstrip() for e in examples], add_special_tokens=False)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    rows = []  # (example, head, context_offset, window_start, window_length, start, end)
    spans = []
    for index, (example, question) in enumerate(zip(examples, questions["input_ids"], strict=True)):
        context_ids, context_spans = by_context[example.context]
        spans.append(context_spans)
        question = question[:max_query_length]
        head = np.array([cls, *question, sep, sep], np.int32)  # what precedes the context
        offset = len(head)
        answer = None if example.is_impossible else _answer_tokens(example, context_spans)
        for start, length in _windows(len(context_ids), seq_len - len(question) - 4, doc_stride):
            label = (0, 0)
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                label = (answer[0] - start + offset, answer[1] - start + offset)
            rows.append((index, head, offset, start, length, *label))
    n = len(rows)
    features = Features(
        input_ids=np.full((n, seq_len), pad, np.int32),
        attention_mask=np.zeros((n, seq_len), np.int32),
        start_positions=np.array([r[5] for r in rows], np.int32).reshape(n),
        end_positions=np.array([r[6] for r in rows], np.int32).reshape(n),
        scoreable=np.zeros((n, seq_len), bool),
        max_context=np.zeros((n, seq_len), bool),
        example_index=np.array([r[0] for r in rows], np.int32).reshape(n),
        context_offset=np.array([r[2] for r in rows], np.int32).reshape(n),
        window_start=np.array([r[3] for r in rows], np.int32).reshape(n),
        spans=tuple(spans),
    )
    for w, (index, head, offset, start, length, _, _) in enumerate(rows):
        context_ids = by_context[examples[index].context][0]
        features.input_ids[w, :offset] = head
        features.input_ids[w, offset : offset + length] = context_ids[start : start + length]
        features.input_ids[w, offset + length] = sep
        features.attention_mask[w, : offset + length + 1] = 1
        features.scoreable[w, 0] = True
        features.scoreable[w, offset : offset + length] = True
    _mark_max_context(features, rows)
    return features


def _answer_tokens(example: Example, spans: np.ndarray) -> tuple[int, int] | None:
    """The first and last context tokens of the first gold answer, from characters: the first
    token that ends after the answer's first character, the last that starts before its end.
    Tokens a byte-level BPE trims to nothing (a lone "Ġ" at (i, i)) are never chosen."""
    if not example.answers:
        return None
    first, last = example.answers[0].start, example.answers[0].start + len(example.answers[0].text)
    after = np.flatnonzero(spans[:, 1] > first)
    before = np.flatnonzero(spans[:, 0] < last)
    if after.size == 0 or before.size == 0 or before[-1] < after[0]:
        return None
    return int(after[0]), int(before[-1])


def _windows(tokens: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over a context of `tokens` tokens, `room` at most each;
    an empty context still gets one (empty) window, so its question gets a prediction."""
    windows, start = [], 0
    while True:
        length = min(tokens - start, room)
        windows.append((start, length))
        if start + length >= tokens:
            return windows
        start += min(length, stride)


def _mark_max_context(features: Features, rows: list) -> None:
    """A context token seen by several windows is scored only in the one where it has the
    most context: the largest min(tokens left, tokens right), plus 0.01 x the window's length,
    the first window winning a tie (COCO-LM's and BERT's rule)."""
    by_example: dict[int, list[int]] = {}
    for w, row in enumerate(rows):
        by_example.setdefault(row[0], []).append(w)
    for windows in by_example.values():
        tokens = max(rows[w][3] + rows[w][4] for w in windows)
        best = np.full(tokens, -np.inf)
        owner = np.full(tokens, -1)
        for w in windows:
            start, length = rows[w][3], rows[w][4]
            here = np.arange(length)
            score = np.minimum(here, length - 1 - here) + 0.01 * length
            wins = score > best[start : start + length]
            best[start : start + length] = np.where(wins, score, best[start : start + length])
            owner[start : start + length] = np.where(wins, w, owner[start : start + length])
        for w in windows:
            offset, start, length = rows[w][2], rows[w][3], rows[w][4]
            features.max_context[w, offset : offset + length] = owner[start : start + length] == w
