"""Interventions on the first token, applied inside the C forward (PAPER.md §3, §8).

Each is chosen per (layer, head):
  * ``mask_first``: queries i >= 1 may not attend to position 0; their attention is
    renormalised over positions 1..i (query 0 has no other key and is left unchanged).
  * ``zero_first_value``: the value vector of position 0 counts as zero, so attending to it
    contributes nothing (the sink becomes an exact no-op).
  * ``head_scale``: the head's output (before W_O) is multiplied by a factor; 0 ablates it.
Running without the BOS token needs no intervention: tokenize with ``bos=False``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple, Union

import numpy as np

Heads = Union[bool, Iterable[Tuple[int, int]], np.ndarray, None]


@dataclass
class Intervention:
    """Which heads to intervene on.

    ``mask_first`` and ``zero_first_value``: True (every head of every layer), an iterable of
    (layer, head) pairs, a boolean array (L, H), or None. ``head_scale``: {(layer, head): factor}
    or a float array (L, H).
    """

    mask_first: Heads = None
    zero_first_value: Heads = None
    head_scale: Union[Dict[Tuple[int, int], float], np.ndarray, None] = field(default=None)

    def arrays(self, n_layers: int, n_heads: int) -> Dict[str, Optional[np.ndarray]]:
        """The C core's form: uint8 (L, H) masks and a float32 (L, H) scale, or None."""
        shape = (n_layers, n_heads)
        return {"mask_first": _mask(self.mask_first, shape, "mask_first"),
                "zero_first_value": _mask(self.zero_first_value, shape, "zero_first_value"),
                "head_scale": _scale(self.head_scale, shape)}


def _pairs(pairs, shape, name):
    for pair in pairs:
        l, h = (int(x) for x in pair)
        if not (0 <= l < shape[0] and 0 <= h < shape[1]):
            raise ValueError(f"{name}: (layer {l}, head {h}) outside a model with {shape[0]} layers x {shape[1]} heads")
        yield l, h


def _mask(spec: Heads, shape, name) -> Optional[np.ndarray]:
    if spec is None or spec is False:
        return None
    if spec is True:
        return np.ones(shape, np.uint8)
    if isinstance(spec, np.ndarray):
        if spec.shape != shape:
            raise ValueError(f"{name} has shape {spec.shape}, expected (layers, heads) = {shape}")
        return np.ascontiguousarray(spec.astype(bool), dtype=np.uint8)
    out = np.zeros(shape, np.uint8)
    for l, h in _pairs(spec, shape, name):
        out[l, h] = 1
    return out


def _scale(spec, shape) -> Optional[np.ndarray]:
    if spec is None:
        return None
    if isinstance(spec, np.ndarray):
        if spec.shape != shape:
            raise ValueError(f"head_scale has shape {spec.shape}, expected (layers, heads) = {shape}")
        out = np.ascontiguousarray(spec, dtype=np.float32)
    else:
        out = np.ones(shape, np.float32)
        for (l, h), factor in zip(_pairs(spec.keys(), shape, "head_scale"), spec.values()):
            out[l, h] = factor
    if not np.all(np.isfinite(out)):
        raise ValueError("head_scale factors must be finite")
    return out
