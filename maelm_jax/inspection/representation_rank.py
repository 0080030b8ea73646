"""The rank of a checkpoint's representations, layer by layer (`python -m maelm_jax.analysis`).

For every encoder layer (0 = the embeddings after their LayerNorm) it measures the
effective rank (`rank.pca_rank`, `rank.entropy_rank`) of real-token representations on
held-out text, once as is ("no_mask") and once with 15% of the tokens replaced by `<mask>`
("mask15"); for MLM checkpoints also the rank of the `<mask>` tokens' representations and
the share of their variance inside the real tokens' 90%-variance subspace. Writes
`rank.json` and `rank.png` to OUT.

Held-out text is the run's eval split read through the project's data pipeline (or
`--text_file`, documents separated by blank lines), packed into the run's blocks.
"""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np

from maelm_jax.config.run_config import ConfigError
from maelm_jax.data.documents import read_documents
from maelm_jax.data.shard_writer import pack_documents
from maelm_jax.inspection import rank, trained_model
from maelm_jax.model.masked_lm import MaskedLM
from maelm_jax.model.modern_blocks import ModernBlock
from maelm_jax.model.transformer import EncoderBlock

MASK_RATE = 0.15


def unrolled(trained: trained_model.TrainedModel) -> tuple[nn.Module, dict]:
    """(model, params) with the layers unrolled (`layers_i`), so each block's output can be
    captured; scanned parameters are unstacked, the computation is unchanged."""
    cfg = dataclasses.replace(
        trained.model_config, scan_layers=False, remat_policy="none", decoder_remat_policy="none"
    )
    params = dict(trained.params)
    encoder = dict(params["encoder"])
    if trained.model_config.scan_layers:
        stacked = encoder.pop("layers")
        for i in range(cfg.num_layers):
            encoder[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
    params["encoder"] = encoder
    return MaskedLM(cfg, pad_id=trained.tokenizer.pad_id, mask_id=trained.tokenizer.mask_id), params


def layer_outputs_fn(model: nn.Module, num_layers: int):
    """Jitted (params, ids [B, T]) -> [num_layers + 1, B, T, E]: embeddings, then each block."""

    def is_layer(module, method_name):
        return method_name == "__call__" and (
            isinstance(module, (EncoderBlock, ModernBlock)) or module.name == "embed_norm"
        )

    def run(params, ids):
        positions = jax.numpy.broadcast_to(jax.numpy.arange(ids.shape[1]), ids.shape)
        _, state = model.apply(
            {"params": params},
            ids,
            positions,
            method=MaskedLM.encode,
            capture_intermediates=is_layer,
        )
        enc = state["intermediates"]["encoder"]
        outs = [enc["embed_norm"]["__call__"][0]]
        blocks = [enc[f"layers_{i}"]["__call__"][0][0] for i in range(num_layers)]
        outs += [b.reshape(outs[0].shape) for b in blocks]  # [B * T, E] where T would pad
        return jax.numpy.stack(outs)

    return trained_model.FullPrecisionJit(run)


def held_out_blocks(
    trained, text_file: str | None, num_tokens: int, dataset: str | None = None
) -> np.ndarray:
    """int32 [n, seq_len] packed blocks holding at least `num_tokens` tokens if the text has
    them. Nothing is cached or written in the workdir. `dataset`: the eval split of this
    dataset in place of the one stored with the checkpoint (the same corpus, moved)."""
    config, tok = trained.config, trained.tokenizer
    if dataset:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, dataset=dataset))
    if text_file:
        with open(text_file, encoding="utf-8") as f:
            docs = [d for d in f.read().split("\n\n") if d.strip()]
    else:
        docs = read_documents(config.data, "eval", 0, 1)
    max_blocks = -(-num_tokens // (config.seq_len - 2)) + 1
    blocks = pack_documents((tok.encode(d) for d in docs), config.seq_len, max_blocks)
    if len(blocks) == 0:
        source = text_file or f"the eval split of dataset={config.data.dataset!r}"
        raise ConfigError(f"{source} holds no text to measure")
    return blocks


def _masked(blocks: np.ndarray, regular: np.ndarray, mask_id: int, seed: int = 0):
    """(blocks with 15% of the regular tokens replaced by `<mask>`, bool mask of them)."""
    rng = np.random.default_rng(seed)
    chosen = regular & (rng.random(blocks.shape) < MASK_RATE)
    return np.where(chosen, mask_id, blocks), chosen


def _hidden(fn, params, blocks: np.ndarray, batch: int = 8) -> np.ndarray:
    """[num_layers + 1, n, seq_len, E] float32, computed `batch` rows at a time."""
    parts = [np.asarray(fn(params, blocks[i : i + batch])) for i in range(0, len(blocks), batch)]
    return np.concatenate(parts, axis=1)


def _ranks(per_layer: np.ndarray, select: np.ndarray, limit: int) -> dict:
    """per_layer [layers, n, T, E], select bool [n, T] -> per-layer ranks of the selected."""
    rows = [layer[select][:limit] for layer in per_layer]
    return {
        "pca90": [rank.pca_rank(x) for x in rows],
        "entropy": [round(rank.entropy_rank(x), 3) for x in rows],
        "num_tokens": int(min(select.sum(), limit)),
    }


def analyse(
    workdir, step: int | None, num_tokens: int, text_file: str | None, dataset: str | None = None
) -> dict:
    """rank.json's content: {"layers": [...], "conditions": {name: {"pca90": [...], ...}}}."""
    trained = trained_model.load(workdir, step)
    tok = trained.tokenizer
    model, params = unrolled(trained)
    fn = layer_outputs_fn(model, trained.model_config.num_layers)
    blocks = held_out_blocks(trained, text_file, num_tokens, dataset)
    regular = blocks >= tok.first_regular_id
    conditions = {"no_mask": _ranks(_hidden(fn, params, blocks), regular, num_tokens)}
    masked_blocks, chosen = _masked(blocks, regular, tok.mask_id)
    hidden = _hidden(fn, params, masked_blocks)
    conditions["mask15_real"] = _ranks(hidden, regular & ~chosen, num_tokens)
    if trained.config.objective == "mlm":
        conditions["mask15_mask"] = _ranks(hidden, chosen, num_tokens)
        conditions["mask15_mask"]["share_in_real_subspace"] = [
            round(
                rank.share_inside(
                    layer[chosen][:num_tokens],
                    rank.principal_subspace(layer[regular & ~chosen][:num_tokens]),
                ),
                4,
            )
            for layer in hidden
        ]
    c = trained.config
    return {
        "workdir": os.fspath(workdir),
        "step": trained.step,
        "objective": c.objective,
        "decoder": c.model.decoder if c.objective == "mae_lm" else None,
        "hidden_size": c.model.hidden_size,
        "text": text_file or f"{dataset or c.data.dataset} (eval split)",
        "layers": list(range(trained.model_config.num_layers + 1)),
        "conditions": conditions,
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, cond in result["conditions"].items():
        axes[0].plot(result["layers"], cond["pca90"], marker="o", label=name)
        axes[1].plot(result["layers"], cond["entropy"], marker="o", label=name)
    axes[0].set_ylabel("components for 90% variance")
    axes[1].set_ylabel("entropy effective rank")
    for ax in axes:
        ax.set_xlabel("layer (0 = embeddings)")
        ax.grid(alpha=0.3)
        ax.legend()
    run = os.path.basename(os.path.normpath(result["workdir"]))
    fig.suptitle(f"{run}: {result['objective']} step {result['step']}, representation rank")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(
    workdir, output_dir, step, num_tokens: int, text_file: str | None, dataset: str | None = None
) -> dict:
    """The command: checks its inputs, measures, writes rank.json and rank.png."""
    if num_tokens < 2:
        raise ConfigError(f"num_tokens={num_tokens} is not allowed; it must be >= 2")
    if text_file and not os.path.exists(text_file):
        raise ConfigError(f"text_file={text_file!r} does not exist")
    result = analyse(workdir, step, num_tokens, text_file, dataset)
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "rank.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.join(output_dir, "rank.png"))
    return result
