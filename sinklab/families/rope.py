"""RoPE inverse frequencies with the scalings Hugging Face and llama.cpp use.

The forward rotates pair i of every head by angle ``position * inv_freq[i]``; scaling only
changes ``inv_freq``, so it is computed here once, in float64, and handed to C as float32.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[Dict[str, Any]] = None) -> np.ndarray:
    """Inverse frequencies (head_dim // 2,) float32 for RoPE base ``theta``.

    ``scaling``: None/``{"rope_type": "default"}``; ``{"rope_type": "linear", "factor": f}``
    (positions divided by f); or llama3's ``{"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}`` as in Hugging Face's
    ``_compute_llama3_parameters``. Any other type raises ValueError naming it.
    """
    inv = 1.0 / (float(theta) ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    scaling = scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind == "default":
        pass
    elif kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        inv = _llama3_inv_freq(inv, scaling)
    else:
        raise ValueError(f"unsupported RoPE scaling type {kind!r} (supported: {', '.join(ROPE_TYPES)})")
    return inv.astype(np.float32)


def _llama3_inv_freq(inv: np.ndarray, s: Dict[str, Any]) -> np.ndarray:
    try:
        factor = float(s["factor"])
        low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_ctx = float(s["original_max_position_embeddings"])
    except KeyError as e:
        raise ValueError(f"llama3 RoPE scaling needs {e.args[0]!r}") from None
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def layer_inv_freq(cfg: Any, factors: Optional[np.ndarray] = None) -> np.ndarray:
    """Each layer's RoPE inverse frequencies, (n_layers, head_dim // 2) float32 C-contiguous.

    Layer l uses ``cfg.layer_rope(l)`` (Gemma 3: the local base on sliding-window layers, the
    global base and scaling on full ones). ``factors``: llama.cpp's ``rope_freqs.weight``
    (llama3 scaling stored as divisors per frequency), applied to every layer in float64.
    """
    rows = {}
    out = np.empty((cfg.n_layers, cfg.head_dim // 2), np.float32)
    for l in range(cfg.n_layers):
        theta, scaling = cfg.layer_rope(l)
        key = (theta, repr(sorted((scaling or {}).items())))
        if key not in rows:
            inv = rope_inv_freq(cfg.head_dim, theta, scaling)
            if factors is not None:
                inv = (inv.astype(np.float64) / factors).astype(np.float32)
            rows[key] = inv
        out[l] = rows[key]
    return out
