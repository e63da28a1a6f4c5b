"""What one forward pass captured, as NumPy arrays, with save/load to .npz."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np


@dataclass
class AttentionStats:
    """Attention statistics computed inside the C kernel, each (L', H, T) float32 for the
    captured layers (a leading B axis with batched ids):

    importance: Gu et al.'s a_k, the mean attention key k receives from queries i >= k.
    to_first: each query's attention to position 0, A[i, 0].
    entropy: each query's attention-row entropy in nats.
    """

    importance: np.ndarray
    to_first: np.ndarray
    entropy: np.ndarray


@dataclass
class Trace:
    """Captured tensors of one run (a leading batch axis B when ids were (B, T)).

    Attributes:
        ids: (T,) or (B, T) int64, the tokens that were run.
        attn: (L', H, T, T) float32 attention probabilities of the captured layers ``layers``
            (rows sum to 1, zero above the diagonal), or None.
        resid: (L+1, T, d) float32 residual stream entering each layer; ``resid[L]`` is the last
            layer's output before the final norm. None if not captured.
        logits: (T - logits_from, V) float32, or None.
        stats: :class:`AttentionStats` of the captured layers, or None.
        layers: indices of the layers whose attention (and stats) are captured.
        meta: model name/config, BOS token used (or None), and anything else a result should carry.
    """

    ids: np.ndarray
    attn: Optional[np.ndarray] = None
    resid: Optional[np.ndarray] = None
    logits: Optional[np.ndarray] = None
    stats: Optional[AttentionStats] = None
    layers: List[int] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)

    def save(self, path: str) -> None:
        """Writes an .npz with every captured array and the metadata as JSON."""
        arrays = {k: v for k, v in (("ids", self.ids), ("attn", self.attn), ("resid", self.resid),
                                     ("logits", self.logits)) if v is not None}
        if self.stats is not None:
            arrays.update({f"stats_{k}": v for k, v in vars(self.stats).items()})
        arrays["layers"] = np.asarray(self.layers, dtype=np.int64)
        arrays["meta"] = np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8)
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str) -> "Trace":
        with np.load(path, allow_pickle=False) as z:
            get = lambda k: z[k] if k in z.files else None  # noqa: E731
            stats = None
            if "stats_importance" in z.files:
                stats = AttentionStats(*(z[f"stats_{k}"] for k in ("importance", "to_first", "entropy")))
            return cls(ids=z["ids"], attn=get("attn"), resid=get("resid"), logits=get("logits"), stats=stats,
                       layers=[int(x) for x in z["layers"]], meta=json.loads(bytes(z["meta"]).decode()))
