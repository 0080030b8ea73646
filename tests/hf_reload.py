"""Run as `python tests/hf_reload.py SPEC.json OUT_DIR`: a user's fresh PyTorch process.

Loads each export with transformers alone (no JAX, no maelm_jax; HF_HUB_OFFLINE=1 set by
the caller) and writes what the tests compare against the JAX side: hidden states (and MLM
logits) on a given padded batch, the tokenizer's ids of sample texts, the fill-mask
pipeline's answer, the losses of a short sequence-classification fine-tune, and a
sentence-transformers embedding of the first text.
"""

import contextlib
import io
import json
import logging
import os
import sys

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    pipeline,
)
from transformers.utils import logging as hf_logging

NOUNS = ("river", "stone", "garden", "window", "letter", "morning", "harbor", "road")
TARGET = "lantern"


def classification_data(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """Texts of 2-5 words; label 1 iff the word TARGET occurs (half of them)."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(NOUNS, rng.integers(2, 6)))
        if i % 2:
            words[rng.integers(len(words))] = TARGET
        texts.append(" ".join(words))
        labels.append(i % 2)
    return texts, labels


def fine_tune(model_dir: str, remote_code: bool, steps: int = 30) -> list[float]:
    """Per-step training losses of AutoModelForSequenceClassification on the data above."""
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=2, trust_remote_code=remote_code
    )
    model.train()
    texts, labels = classification_data(64)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for step in range(steps):
        idx = [(step * 16 + j) % len(texts) for j in range(16)]
        batch = tok([texts[i] for i in idx], padding=True, truncation=True, return_tensors="pt")
        out = model(**batch, labels=torch.tensor([labels[i] for i in idx]))
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss))
    return losses


def main(spec_path: str, out_dir: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    ids = torch.tensor(spec["ids"])
    result = {}
    for kind, export in spec["exports"].items():
        path, remote, mlm = export["dir"], export["remote_code"], export["mlm"]
        printed = io.StringIO()  # transformers' remote-code prompt and warnings, if any
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            hf_logging.add_handler(handler := logging.StreamHandler(printed))
            try:
                tok = AutoTokenizer.from_pretrained(path)  # no trust_remote_code, as a user
                plain_config = type(AutoConfig.from_pretrained(path)).__name__
            finally:
                hf_logging.remove_handler(handler)
        auto = AutoModelForMaskedLM if mlm else AutoModel
        model = auto.from_pretrained(path, trust_remote_code=remote).eval()
        with torch.no_grad():
            valid = ids != tok.pad_token_id
            out = model(ids, attention_mask=valid)
            hidden = model.base_model(ids, attention_mask=valid).last_hidden_state
        np.save(os.path.join(out_dir, f"{kind}_hidden.npy"), hidden.numpy())
        entry = {
            "class": type(model).__name__,
            "tokenizer_printed": printed.getvalue(),
            "plain_config": plain_config,
            "token_ids": [tok(t)["input_ids"] for t in spec["texts"]],
            "special": {
                "bos": tok.bos_token_id,
                "pad": tok.pad_token_id,
                "eos": tok.eos_token_id,
                "unk": tok.unk_token_id,
                "mask": tok.mask_token_id,
            },
        }
        if mlm:
            np.save(os.path.join(out_dir, f"{kind}_logits.npy"), out.logits.numpy())
            fill = pipeline("fill-mask", model=path, tokenizer=path, top_k=3)
            entry["fill_mask"] = fill(spec["fill_mask_text"])
        if kind in spec.get("sentence_transformers", []):
            from sentence_transformers import SentenceTransformer

            encoder = SentenceTransformer(path, device="cpu")  # mean pooling by default
            text = spec["texts"][0]
            # its own tokenization: cut to the model's max_seq_length
            entry["sentence_ids"] = encoder.tokenize([text])["input_ids"][0].tolist()
            entry["sentence_embedding"] = encoder.encode([text])[0].tolist()
        if kind in spec["fine_tune"]:
            entry["fine_tune_losses"] = fine_tune(path, remote)
        result[kind] = entry
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
