"""Defaults every config starts from: RoBERTa-base sizes, the MAE-LM objective, a pod mesh.

Variants import this module, call `get_config()` and override; `use_large_model` applies the
large sizes. Every key, its default and why (and the recipe they follow) is documented once,
in maelm_jax/config/defaults.py: the package completes an older checkpoint's config from
those defaults, and it imports nothing from configs/.
"""

import ml_collections

from maelm_jax.config import defaults
from maelm_jax.config.defaults import DEFAULT_AXIS_RULES, use_large_model

__all__ = ["DEFAULT_AXIS_RULES", "get_config", "use_large_model"]


def get_config() -> ml_collections.ConfigDict:
    return defaults.get_config()
