"""Small English-like text corpora on disk, and a data config that reads them fast.

Shared by the document and create_datasets tests; the fixtures stay in the test modules.
"""

import numpy as np

from configs import default
from maelm_jax.config import configdict

NOUNS = ("river", "stone", "garden", "window", "letter", "morning", "harbor", "lantern", "road")
ADJECTIVES = ("quiet", "old", "narrow", "silver", "bright", "distant", "gentle", "cold", "green")


def sample_document(i: int) -> str:
    """A unique English-like document of 1 to 4 sentences, some on separate lines."""
    rng = np.random.default_rng(i)
    sentences = []
    for _ in range(1 + i % 4):
        a, b = rng.choice(ADJECTIVES, 2)
        n, m = rng.choice(NOUNS, 2)
        sentences.append(f"The {a} {n} stood near the {b} {m} for {i} days.")
    return ("\n" if i % 3 == 0 else " ").join(sentences)


def write_corpus(root, docs, files=3):
    """Splits `docs` over `files` files, separated by varied blank lines; adds a non-match."""
    root.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(docs) // files)
    for f in range(files):
        chunk = docs[f * per_file : (f + 1) * per_file]
        separators = ["\n\n", "\n  \n\n", "\n\t\n"]
        body = "".join(d + separators[i % 3] for i, d in enumerate(chunk))
        (root / f"part{f}.txt").write_text("\n\n" + body)
    (root / "notes.md").write_text("Not part of the corpus.\n")
    return f"text:{root}/*.txt"


def sample_corpus(root):
    """(dataset, documents): 40 sample documents written under `root`."""
    docs = [sample_document(i) for i in range(40)]
    return write_corpus(root, docs), docs


def data_config(dataset, **overrides):
    """The default config's DataConfig with tiny blocks and batches, reading `dataset`."""
    c = default.get_config()
    c.dataset = dataset
    c.seq_len = 16
    c.batch_size = 4
    c.eval_batches = 2
    c.eval_holdout_fraction = 0.25
    for key, value in overrides.items():
        c[key] = value
    return configdict.freeze(c).data
