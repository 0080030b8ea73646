"""The modern backbone's encoder -> HuggingFace `ModernBertModel` / `ModernBertForMaskedLM`.

Native transformers classes (since 4.48), so an export loads with plain `AutoModel` and no
`trust_remote_code`. The mapping (model/modern_blocks.py): the separate query, key and value
kernels [E, N, H] concatenate into `Wqkv` [3 * N * H, E]; the GLU's `wi_input` and `wi_gate`
concatenate into `Wi` [2 * M, E] (HF chunks it in that order); the first layer has no
`attn_norm` (ours exists at layer 0 but is skipped, so it is not exported); no biases but the
MLM decoder's. Layer kinds go out as HF's `layer_types`; the window as `local_attention`
(HF's query sees |i - j| <= local_attention // 2, as ours does).
"""

import numpy as np

from maelm_jax.config.run_config import ModelConfig
from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, MASK_ID, PAD_ID
from maelm_jax.hf.convert import layers_of
from maelm_jax.model.positions.rotary import is_global_layer


def layer_types(cfg: ModelConfig) -> list[str]:
    return [
        "full_attention"
        if is_global_layer(i, cfg.global_attention_every_n_layers)
        else "sliding_attention"
        for i in range(cfg.num_layers)
    ]


def hf_config(cfg: ModelConfig, vocab_size: int, with_lm_head: bool) -> dict:
    return {
        "model_type": "modernbert",
        "architectures": ["ModernBertForMaskedLM" if with_lm_head else "ModernBertModel"],
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "hidden_activation": "gelu",  # exact (erf), as nn.gelu(approximate=False)
        "classifier_activation": "gelu",
        "max_position_embeddings": cfg.max_positions,
        "initializer_range": cfg.init_std,
        "norm_eps": cfg.layer_norm_epsilon,
        "norm_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "classifier_bias": False,
        "decoder_bias": True,
        "attention_dropout": cfg.attention_dropout_rate,
        "embedding_dropout": cfg.dropout_rate,
        "mlp_dropout": cfg.dropout_rate,
        "local_attention": cfg.local_attention,
        "global_attn_every_n_layers": cfg.global_attention_every_n_layers,
        "layer_types": layer_types(cfg),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta_local},
        },
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "cls_token_id": BOS_ID,
        "sep_token_id": EOS_ID,
        "mask_token_id": MASK_ID,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def _weight(kernel) -> np.ndarray:
    """A Dense kernel [in, out] -> a Linear weight [out, in]."""
    return np.asarray(kernel).T


def _layer(prefix: str, p: dict, index: int, hidden: int) -> dict:
    att = p["attention"]
    qkv = [np.asarray(att[f"{n}_kernel"]).reshape(hidden, -1) for n in ("query", "key", "value")]
    out = {
        f"{prefix}.attn.Wqkv.weight": np.concatenate(qkv, axis=1).T,
        f"{prefix}.attn.Wo.weight": np.asarray(att["out_kernel"]).reshape(hidden, -1),
        f"{prefix}.mlp_norm.weight": np.asarray(p["mlp_norm"]["scale"]),
        f"{prefix}.mlp.Wi.weight": np.concatenate(
            [_weight(p["mlp"]["wi_input"]["kernel"]), _weight(p["mlp"]["wi_gate"]["kernel"])]
        ),
        f"{prefix}.mlp.Wo.weight": _weight(p["mlp"]["wo"]["kernel"]),
    }
    if index:  # HF's layer 0 has an Identity there; ours is skipped (modern_blocks.py)
        out[f"{prefix}.attn_norm.weight"] = np.asarray(p["attention_norm"]["scale"])
    return out


def state_dict(
    params: dict, cfg: ModelConfig, vocab_size: int, with_lm_head: bool
) -> dict[str, np.ndarray]:
    """float32 arrays named as `ModernBertModel` (no prefix) or `ModernBertForMaskedLM`
    (`model.`, `head.*`, `decoder.bias`; the decoder weight is tied on load)."""
    enc = params["encoder"]
    base = "model." if with_lm_head else ""
    out = {
        f"{base}embeddings.tok_embeddings.weight": np.asarray(params["token_embed"]["embedding"])[
            :vocab_size
        ],
        f"{base}embeddings.norm.weight": np.asarray(enc["embed_norm"]["scale"]),
        f"{base}final_norm.weight": np.asarray(enc["final_norm"]["scale"]),
    }
    for i, layer in enumerate(layers_of(enc, cfg.num_layers, cfg.scan_layers)):
        out |= _layer(f"{base}layers.{i}", layer, i, cfg.hidden_size)
    if with_lm_head:
        head = params["lm_head"]
        out["head.dense.weight"] = _weight(head["dense"]["kernel"])
        out["head.norm.weight"] = np.asarray(head["norm"]["scale"])
        out["decoder.bias"] = np.asarray(head["output_bias"])[:vocab_size]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
