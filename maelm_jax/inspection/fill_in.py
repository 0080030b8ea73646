"""Fill in the blanks: a few held-out passages, masked as the eval loss masks them, with the
trained model's top guesses for each masked piece, so a person sees what was learned.

The guesses come from the real eval path (`train_step.eval_masks` + `eval_logits`: the
MAE-LM encoder never sees the masked pieces), on the first eval batch.
"""

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from maelm_jax.step import train_step

_SHOWN_TARGETS = 4  # masked pieces per passage
_CONTEXT = 10  # pieces shown before the first masked one


def top_guesses(params, input_ids, *, model, masking_cfg, seed, top_k: int) -> dict:
    """Eval batch 0's masks and the model's `top_k` guesses per masked slot.

    input_ids [B, L] -> ids [B, L], masked_idx / labels / weights [B, k],
    guess_ids / guess_probs [B, k, top_k].
    """
    masked = train_step.eval_masks(input_ids, 0, masking_cfg=masking_cfg, seed=seed)
    probs = jax.nn.softmax(train_step.eval_logits(params, masked, model), axis=-1)
    guess_probs, guess_ids = jax.lax.top_k(probs, top_k)
    return {
        "ids": input_ids,
        "masked_idx": masked.masked_idx,
        "labels": masked.labels,
        "weights": masked.mask_weights,
        "guess_ids": guess_ids,
        "guess_probs": guess_probs,
    }


def _piece(tokenizer: Tokenizer, token_id: int) -> str:
    """A piece as it reads in running text: "▁the" -> " the", `</s>` -> " ¶"."""
    if token_id == EOS_ID:
        return " ¶"
    if token_id >= tokenizer.vocab_size:  # a padding row of the embedding (an early guess)
        return f" <unused {int(token_id)}>"
    return tokenizer.id_to_piece(int(token_id)).replace("\u2581", " ")


def _word(tokenizer: Tokenizer, token_id: int) -> str:
    """A piece on its own: "▁the" -> "the"; a piece that is only a space -> "␣"."""
    return _piece(tokenizer, token_id).strip() or "\u2423"


def format_passages(guesses: dict, tokenizer: Tokenizer, num_passages: int) -> str:
    """Readable text: each passage with its masked pieces as [1], [2], ..., then per blank
    the true piece and the model's guesses with their probabilities."""
    lines = [
        "Fill in the blanks (held-out text; [n] marks a masked piece, which the model "
        "never saw; its guesses follow with their probabilities):"
    ]
    shown = 0
    for row in range(guesses["ids"].shape[0]):
        if shown == num_passages:
            break
        ids = guesses["ids"][row]
        slots = [
            (int(pos), j)
            for j, pos in enumerate(guesses["masked_idx"][row])
            if guesses["weights"][row, j] > 0
        ]
        if not slots:
            continue  # a padding row
        slots = sorted(slots)[:_SHOWN_TARGETS]
        start = max(0, slots[0][0] - _CONTEXT)
        end = min(len(ids), slots[-1][0] + _CONTEXT + 1)
        number = {pos: n for n, (pos, _) in enumerate(slots, 1)}
        text = []
        for pos in range(start, end):
            if ids[pos] in (BOS_ID, PAD_ID):
                continue
            text.append(f" [{number[pos]}]" if pos in number else _piece(tokenizer, ids[pos]))
        shown += 1
        lines.append(f"{shown}. ...{''.join(text).strip()}...")
        for n, (_, j) in enumerate(slots, 1):
            answer = _word(tokenizer, guesses["labels"][row, j])
            options = ", ".join(
                f"{_word(tokenizer, g)} {p:.0%}"
                for g, p in zip(
                    guesses["guess_ids"][row, j], guesses["guess_probs"][row, j], strict=True
                )
            )
            lines.append(f"   [{n}] {answer!r:<14} model: {options}")
    return "\n".join(lines)


def print_fill_in(
    progs, params, eval_batches, tokenizer: Tokenizer, seed: int, num_passages=3
) -> None:
    """Prints `format_passages` on process 0; collective (every process computes)."""
    if not eval_batches:
        return
    guess = jax.jit(
        functools.partial(
            top_guesses, model=progs.model, masking_cfg=progs.masking_cfg, seed=seed, top_k=3
        ),
        in_shardings=(progs.state_shardings.params, progs.batch_sharding),
        out_shardings=NamedSharding(progs.mesh, PartitionSpec()),
    )
    batch = progs.global_batch(eval_batches[0])
    guesses = {
        k: np.asarray(v) for k, v in jax.device_get(guess(params, batch["input_ids"])).items()
    }
    if jax.process_index() == 0:
        print(format_passages(guesses, tokenizer, num_passages), flush=True)
