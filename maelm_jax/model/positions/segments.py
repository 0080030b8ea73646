"""Document segment ids of packed blocks, derived on device from the `</s>` that ends each
document.

A block is `<s>` followed by a stretch of the document stream in which every document ends with
`</s>` (`pack_documents` in data/shard_writer.py), and corpus text never encodes to `</s>` (see
tokenizer.py), so a token's document within its block follows exactly from the block alone:
segment id = 1 + the number of `</s>` strictly before it (`<s>` and a document's own `</s>`
belong to the document; a document cut by a block boundary is a segment in each block); padding
is segment 0. Deriving the ids in the step, rather than storing them beside the blocks, keeps
the shards and every batch a single int array, costs one cumsum per step, and gives the same ids
to anything that holds only token ids (eval rows, a resumed run's old cache).

`packing="concatenated"` is the RoBERTa FULL-SENTENCES behaviour this replaced, kept for
comparison: the whole block is one segment (attention crosses documents), padding still 0.
"""

import jax
import jax.numpy as jnp

from maelm_jax.config.run_config import PACKINGS


def segment_ids(ids: jax.Array, eos_id: int, pad_id: int, packing: str) -> jax.Array:
    """ids [..., L] int -> int32 [..., L]: documents 1, 2, ... in block order; padding 0."""
    is_pad = ids == pad_id
    if packing == "concatenated":
        return (~is_pad).astype(jnp.int32)
    if packing != "segmented":
        raise ValueError(f"packing={packing!r}; use one of {PACKINGS}")
    eos = (ids == eos_id).astype(jnp.int32)
    return jnp.where(is_pad, 0, 1 + jnp.cumsum(eos, axis=-1) - eos)
