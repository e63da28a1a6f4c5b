"""Attention statistics at long inference contexts, streamed from the C kernel without a T×T
buffer: the sink rate, the attention queries >= 1 give position 0, and the row entropy, with and
without ⟨bos⟩, over several independent stretches of text (the units of an interval)."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from ..inputs import BOS, NOBOS, prepare
from ..prompts import load_passages
from .sinks import sink_rate_of

N_WINDOWS = 3     # independent stretches of text per model and condition (the interval's units)


def long_texts(model: Any, T: int, n: int = N_WINDOWS) -> List[np.ndarray]:
    """``n`` stretches of T text tokens (no BOS): the shipped passages joined by blank lines, each
    stretch starting at another passage (rotated order), so they share no starting text."""
    passages = load_passages("all")
    out = []
    for w in range(n):
        ids: List[int] = []
        order = passages[w * len(passages) // n:] + passages[: w * len(passages) // n]
        for p in order:
            ids.extend(int(i) for i in prepare(model, p + "\n\n", False, T))
            if len(ids) >= T:
                break
        out.append(np.asarray(ids[:T], np.int64))
    return out


def long_context_stats(model: Any, texts: List[np.ndarray], eps: float) -> Dict[str, Any]:
    """Per condition (with / without ⟨bos⟩, T tokens in both): per window the sink rate, the mean
    attention to position 0 over queries >= 1 and the mean row entropy; arrays (n_windows,)."""
    T = len(texts[0])
    out = {}
    for key, bos in ((BOS, True), (NOBOS, False)):
        rate, to0, ent = [], [], []
        for x in texts:
            st = model.run(prepare(model, x, bos, T), capture=("stats",), logits_from=-1, progress=False).stats
            rate.append(sink_rate_of(st.importance[:, :, 0], eps))
            to0.append(float(st.to_first[:, :, 1:].mean()))
            ent.append(float(st.entropy[:, :, 1:].mean()))
        out[key] = {"sink_rate": np.array(rate), "to_first": np.array(to0), "entropy": np.array(ent)}
    return out
