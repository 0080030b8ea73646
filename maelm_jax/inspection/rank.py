"""How many directions token representations use: the MAE-LM paper's rank measurements.

An MLM encoder must keep [MASK] tokens' representations apart from real tokens', and the
paper (Meng et al., 2024) shows this costs the real tokens dimensions: their
representations span fewer directions than an encoder that never sees [MASK]. Both measures
work on centred representations [n_tokens, hidden], so a shared offset is not a direction.
"""

import numpy as np

VARIANCE_SHARE = 0.9


def _centred(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x - x.mean(axis=0, keepdims=True)


def singular_values(x: np.ndarray) -> np.ndarray:
    """[n, d] -> the centred matrix's singular values, descending."""
    return np.linalg.svd(_centred(x), compute_uv=False)


def pca_rank(x: np.ndarray, share: float = VARIANCE_SHARE) -> int:
    """The number of principal components that explain `share` of the variance of x [n, d]."""
    var = singular_values(x) ** 2
    if var.sum() == 0:
        return 0
    explained = np.cumsum(var) / var.sum()
    return int(np.searchsorted(explained, share - 1e-12) + 1)


def entropy_rank(x: np.ndarray) -> float:
    """Roy & Vetterli's effective rank exp(H(p)), p = singular values / their sum: equals r
    for r equal singular values, and falls smoothly as the spectrum gets peakier."""
    s = singular_values(x)
    if s.sum() == 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def principal_subspace(x: np.ndarray, share: float = VARIANCE_SHARE) -> np.ndarray:
    """Orthonormal basis [d, r] of the directions that explain `share` of x's variance."""
    _, s, vt = np.linalg.svd(_centred(x), full_matrices=False)
    var = s**2
    r = int(np.searchsorted(np.cumsum(var) / var.sum(), share - 1e-12) + 1)
    return vt[:r].T


def share_inside(y: np.ndarray, basis: np.ndarray) -> float:
    """Fraction of y's (centred) variance lying in span(basis): 1 when y varies only along
    those directions, about r / d for directions unrelated to them."""
    y = _centred(y)
    total = float((y**2).sum())
    if total == 0:
        return 0.0
    return float(((y @ basis) ** 2).sum() / total)
