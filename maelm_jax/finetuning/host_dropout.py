"""Dropout on a CPU with masks cut from blocks of 64-bit random words, four elements a word.

PyTorch's CPU dropout draws one Mersenne Twister number per element (`bernoulli_`), about
9 ns an element on the 2-core development machine: a quarter of a fine-tuning step of the
default export (4 x 256, batch 16; docs/results.md). Here one `random_` call fills a block
of words from the same generator, so `torch.manual_seed` still decides every mask, and each
16-bit quarter of a word keeps or drops one element: about 2.5 ns an element, and two ATen
calls a dropout site (a view and the multiply) in place of one.

The rate is the module's `p` rounded to 1/65536 (0.1 drops 6554 in 65536), and kept
elements are scaled by the inverse of the rounded keep rate, so the expectation is exact.
Only `nn.Dropout` modules change; attention dropout inside SDPA stays PyTorch's.
"""

import math

import torch
from torch import nn

BLOCK = 1 << 21  # mask elements drawn at once (8 MB of float32): a step or so of the demo's
_QUARTERS = 65536  # values of a 16-bit quarter


class MaskPool:
    """keep / (1 - rate) masks of one rate, handed out in order from the current block; a
    request that does not fit in what is left of it starts a new block."""

    def __init__(self, p: float, block: int = BLOCK):
        dropped = round(p * _QUARTERS)
        self.threshold = dropped - _QUARTERS // 2  # int16 quarters below it drop
        self.scale = 1.0 / (1.0 - dropped / _QUARTERS)
        self.block = block
        self.clear()

    def clear(self) -> None:
        """Forget the current block: what follows depends only on the generator's state."""
        self.masks, self.used = None, 0

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        if self.masks is None or self.used + n > self.masks.numel():
            size = max(n, self.block)
            words = torch.empty(-(-size // 4), dtype=torch.int64)
            words.random_(torch.iinfo(torch.int64).min, None)  # all 64 bits; plain is 63
            quarters = words.view(torch.int16)
            self.masks = (quarters >= self.threshold).to(torch.float32).mul_(self.scale)
            self.used = 0
        # The next n elements as `shape`, in one call (a slice and a view would be two).
        mask = self.masks.as_strided(shape, _strides(shape), self.used)
        self.used += n
        return mask if dtype == torch.float32 else mask.to(dtype)


def _strides(shape) -> tuple[int, ...]:
    """A contiguous tensor's strides for `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class HostDropout(nn.Dropout):
    """`nn.Dropout` with its masks from a shared `MaskPool` (no parameters: state dicts and
    parameter names stay the model's)."""

    def __init__(self, p: float, pool: MaskPool):
        super().__init__(p)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return super().forward(x)
        return x * self.pool.take(x.shape, x.dtype)


def use_host_dropout(model: nn.Module, block: int = BLOCK) -> int:
    """Replaces every plain `nn.Dropout` in `model` by a `HostDropout`, one pool per rate;
    returns how many it replaced. Rates that round to 0 or 1 in 1/65536 keep PyTorch's."""
    pools: dict[float, MaskPool] = {}
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Dropout or child.inplace:
                continue
            if not 0 < round(child.p * _QUARTERS) < _QUARTERS:
                continue  # PyTorch's module is exact (and no slower) at these rates
            pool = pools.setdefault(child.p, MaskPool(child.p, block))
            setattr(parent, name, HostDropout(child.p, pool))
            replaced += 1
    return replaced


def clear_pools(model: nn.Module) -> None:
    """A run's masks come from its own seed, not from a block an earlier run left."""
    for module in model.modules():
        if isinstance(module, HostDropout):
            module.pool.clear()
