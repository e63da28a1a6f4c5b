"""What one forward pass captured, as NumPy arrays, with save/load to .npz."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np


@dataclass
class Trace:
    """Captured tensors of one run (a leading batch axis B when ids were (B, T)).

    Attributes:
        ids: (T,) or (B, T) int64, the tokens that were run.
        attn: (L', H, T, T) float32 attention probabilities of the captured layers ``layers``
            (rows sum to 1, zero above the diagonal), or None.
        resid: (L+1, T, d) float32 residual stream entering each layer; ``resid[L]`` is the last
            layer's output before the final norm. None if not captured.
        logits: (T, V) float32, or None.
        layers: indices of the layers whose attention is in ``attn``.
        meta: model name/config, BOS token used (or None), and anything else a result should carry.
    """

    ids: np.ndarray
    attn: Optional[np.ndarray] = None
    resid: Optional[np.ndarray] = None
    logits: Optional[np.ndarray] = None
    layers: List[int] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)

    def save(self, path: str) -> None:
        """Writes an .npz with every captured array and the metadata as JSON."""
        arrays = {k: v for k, v in (("ids", self.ids), ("attn", self.attn), ("resid", self.resid),
                                     ("logits", self.logits)) if v is not None}
        arrays["layers"] = np.asarray(self.layers, dtype=np.int64)
        arrays["meta"] = np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8)
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str) -> "Trace":
        with np.load(path, allow_pickle=False) as z:
            get = lambda k: z[k] if k in z.files else None  # noqa: E731
            return cls(ids=z["ids"], attn=get("attn"), resid=get("resid"), logits=get("logits"),
                       layers=[int(x) for x in z["layers"]], meta=json.loads(bytes(z["meta"]).decode()))
