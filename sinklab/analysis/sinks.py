"""Sink metrics of Gu et al. (2024), as used throughout Barbero et al. (2025).

Importance of key k in head (l, h): the mean attention it receives from the queries that can see
it, a_k = 1/(T-k) * sum_{i>=k} A[i, k] (0-based). Sink rate of key k: the fraction of (layer,
head) pairs with a_k > eps; with several prompts the indicator is averaged over (prompt, layer,
head). GQA models count query heads.
"""
from __future__ import annotations

import numpy as np


def _check_attn(attn: np.ndarray) -> np.ndarray:
    a = np.asarray(attn)
    if a.ndim not in (4, 5) or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"attention must have shape (L, H, T, T) or (B, L, H, T, T), got {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"attention must be floating point, got {a.dtype}")
    return a


def check_eps(eps: float) -> float:
    """``eps`` as a float sink threshold, or a ValueError unless it lies in (0, 1): the one check
    of a threshold, wherever a user passes one."""
    if not 0.0 < float(eps) < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    return float(eps)


def sink_indicator(importance: np.ndarray, eps: float = 0.3) -> np.ndarray:
    """float64 1.0 where ``importance`` (any shape, e.g. (P, L, H) a_0 per prompt, layer and
    head) exceeds ``eps`` (checked), else 0.0: the per-head sinks whose mean is the sink rate."""
    return (np.asarray(importance) > check_eps(eps)).astype(np.float64)


def sink_rate_of(importance: np.ndarray, eps: float = 0.3) -> float:
    """The sink rate from importances: the fraction in [0, 1] of the entries of ``importance``
    (any shape) that exceed ``eps`` (checked), the mean of :func:`sink_indicator`."""
    return float(np.mean(np.asarray(importance) > check_eps(eps)))


def key_importance(attn: np.ndarray) -> np.ndarray:
    """Importance a_k of every key: (..., L, H, T) from attention (..., L, H, T, T), float64.

    Column sums of the causal (lower-triangular) part divided by the number of queries that see
    key k, T - k.
    """
    a = _check_attn(attn)
    T = a.shape[-1]
    col = np.tril(a).sum(axis=-2, dtype=np.float64)
    return col / (T - np.arange(T, dtype=np.float64))


def first_token_importance(attn: np.ndarray, k: int = 0) -> np.ndarray:
    """a_k for one key (default the first token): (L, H) or (B, L, H), float64."""
    a = _check_attn(attn)
    T = a.shape[-1]
    if not 0 <= k < T:
        raise ValueError(f"key position {k} outside [0, {T})")
    col = a[..., k:, k].sum(axis=-1, dtype=np.float64)  # queries i >= k see key k
    return col / (T - k)


def sink_rate(attn: np.ndarray, eps: float = 0.3, k: int = 0) -> float:
    """Fraction in [0, 1] of (prompt, layer, head) triples whose importance of key ``k`` exceeds ``eps``.

    ``attn``: (L, H, T, T) or (B, L, H, T, T) attention probabilities. Multiply by 100 for the
    paper's percentages. Gu et al. use eps=0.3; the paper's Table 1 uses 0.8.
    """
    return sink_rate_of(first_token_importance(attn, k), eps)
