"""Reference values the training figures draw and the training summaries report, without
matplotlib (the trainer imports them; :mod:`.figures_training` draws with them): the sink
metric's T and the first-token importance of uniform attention over it."""
from __future__ import annotations

import numpy as np

SINK_TOKENS = 64
"""T of the training runs' sink metric (Gu et al.), the default of
:func:`sinklab.train.evaluate.evaluate`; kept here so the figures draw from a summary alone
(viz imports no training code; tests/test_architecture.py checks the two values agree)."""


def uniform_first_importance(T: int) -> float:
    """a_0 of a head that attends uniformly over its causal prefix, over T tokens:
    1/T Σ_{i<T} 1/(i+1) = H_T / T (0.074 at T = 64). A trained head's a_0 above it leans on
    position 0; the sink rate counts only heads above eps."""
    if T < 1:
        raise ValueError(f"T must be at least 1, got {T}")
    return float(np.sum(1.0 / np.arange(1, T + 1)) / T)


def sink_T(context: int) -> int:
    """T of the training runs' sink metric: 64 tokens, or the context when shorter."""
    return min(SINK_TOKENS, int(context))
