"""Windowed attention with and without sink tokens (StreamingLLM, Xiao et al., 2024), beyond the
paper: how much does perplexity rise when every query sees only its w most recent keys, and how
much of that do the first k tokens, kept visible to every query, win back?

Question answered: at a long context T, the next-token NLL of the last ``n_scored`` tokens of a
stretch of text under (a) full attention, (b) a sliding window of w keys (``Model.run(window=w)``),
(c) the same window plus the first k ∈ ``keeps`` positions kept visible (``keep_first=k``; k = 0
is (b)). StreamingLLM's observation: with no kept token perplexity explodes once T exceeds w, and
keeping the first few (the attention sinks) restores it. A model trained with a fixed ⟨bos⟩
(Gemma 3) puts its sink there; models trained without one (SmolLM2, Qwen2.5) sink on whatever
token comes first, so here the first text token.

Where the window applies: to every layer; a layer whose own sliding window is smaller keeps its
own (Gemma 3's local layers, 512 keys: a w >= 512 changes only its global layers; the kept
first k are added to every layer, local ones included).

Text: :func:`sinklab.analysis.long_context.long_texts`, the shipped passages joined by blank lines,
each stretch starting at another passage (the units of the intervals); the model's own ⟨bos⟩ rule
(``bos=None``) puts a ⟨bos⟩ in front (it counts among the T). Scored: the predictions of the last
``n_scored`` positions (targets T - n_scored .. T - 1), far past every window, so the logits
buffer is (n_scored + 1, V) rather than (T, V). Intervals: 95 % bootstrap over the text stretches
of the paired ΔNLL against full attention (:func:`sinklab.analysis.stats.mean_ci`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional, Sequence

import numpy as np

from ..progress import progress_bar
from ..reprs import compact_repr
from ..results import to_jsonable
from .long_context import long_texts
from .quality import nll_rows
from .stats import Interval, mean_ci

FORMAT = "sinklab.WindowedPerplexity/1"


@compact_repr
@dataclass
class WindowedPerplexity:
    """Windowed-attention NLL of one model (see the module docstring).

    Attributes (N text stretches, W windows, K kept-token counts):
        nll_full: (N,) float64, mean NLL in nats of the scored tokens under full attention.
        nll: (N, W, K) float64, the same under window ``windows[w]`` with ``keeps[k]`` first
            positions kept visible.
        windows, keeps: the settings; T the tokens per stretch (⟨bos⟩ included), n_scored the
            predictions scored per stretch, bos whether a ⟨bos⟩ leads each stretch.
    """

    nll_full: np.ndarray
    nll: np.ndarray
    windows: tuple
    keeps: tuple
    T: int
    n_scored: int
    bos: bool
    model: str
    extra: Dict[str, Any] = field(default_factory=dict)

    def delta(self, w: int, k: int) -> Interval:
        """ΔNLL (nats) of window ``w`` with ``k`` kept tokens minus full attention, over stretches;
        exp of it is the perplexity ratio."""
        return mean_ci(self.nll[:, self.windows.index(w), self.keeps.index(k)] - self.nll_full, seed=0)

    def sink_gain(self, w: int, k: int) -> Interval:
        """ΔNLL without kept tokens minus ΔNLL with ``k`` kept (nats): what keeping them wins back."""
        wi = self.windows.index(w)
        return mean_ci(self.nll[:, wi, self.keeps.index(0)] - self.nll[:, wi, self.keeps.index(k)], seed=0)

    def to_dict(self) -> Dict[str, Any]:
        d = to_jsonable(asdict(self))
        d["format"] = FORMAT
        return d


def _check(model: Any, T: int, windows: Sequence[int], keeps: Sequence[int], n_texts: int, n_scored: int):
    if model.config.bidirectional:
        raise ValueError(f"{model.name}: windowed perplexity needs a causal language model")
    if not model.config.has_lm_head:
        raise ValueError(f"{model.name}: windowed perplexity needs an LM head")
    windows, keeps = tuple(int(w) for w in windows), tuple(int(k) for k in keeps)
    if not windows or any(w < 1 for w in windows) or len(set(windows)) != len(windows):
        raise ValueError(f"windows must be distinct ints >= 1, got {windows}")
    if 0 not in keeps or any(k < 0 for k in keeps) or len(set(keeps)) != len(keeps):
        raise ValueError(f"keeps must be distinct counts >= 0 including 0 (the plain window), got {keeps}")
    if not 1 <= n_scored < T:
        raise ValueError(f"n_scored={n_scored} must be in [1, T={T})")
    if n_texts < 2:
        raise ValueError(f"n_texts={n_texts}: an interval needs at least 2 stretches of text")
    return windows, keeps


def windowed_perplexity(model: Any, T: int = 1024, windows: Sequence[int] = (64, 128),
                        keeps: Sequence[int] = (0, 1, 4), n_texts: int = 3, n_scored: int = 128,
                        bos: Optional[bool] = None, progress: bool = True) -> WindowedPerplexity:
    """Next-token NLL at context T with full attention and with each sliding window, with and
    without the first k positions kept visible (StreamingLLM's sink tokens).

    Args:
        model: a causal :class:`sinklab.Model` with an LM head.
        T: tokens per stretch (⟨bos⟩ included), at most the model's context.
        windows: window lengths w (keys per query, the query's own included).
        keeps: kept first-position counts k; must include 0 (the plain window).
        n_texts: stretches of text (the intervals' units), >= 2.
        n_scored: predictions scored per stretch, the last ones.
        bos: lead each stretch with the model's ⟨bos⟩; None: the model's own rule.
        progress: a progress bar over the runs.

    Returns:
        A :class:`WindowedPerplexity`; ValueError for bad settings (named).
    """
    windows, keeps = _check(model, T, windows, keeps, n_texts, n_scored)
    if bos is None:
        bos = bool(getattr(model.tokenizer, "add_bos_default", False)) and model.config.bos_token_id is not None
    lead = [model.bos_id(True)] if bos else []
    seqs = [np.asarray(lead + list(x[: T - len(lead)]), np.int64) for x in long_texts(model, T, n_texts)]
    if any(len(s) < T for s in seqs):
        raise ValueError(f"the shipped passages give fewer than T={T} tokens per stretch")
    settings = [(None, 0)] + [(w, k) for w in windows for k in keeps]
    out = np.empty((n_texts, len(settings)))
    jobs = [(n, s) for n in range(n_texts) for s in range(len(settings))]
    tr = None
    for n, s in progress_bar(jobs, progress, desc=f"windowed perplexity ({model.name}, T={T})", unit="run"):
        w, k = settings[s]
        tr = model.run(seqs[n], capture=("logits",), logits_from=T - n_scored - 1, progress=False, out=tr,
                       window=w, keep_first=k)
        out[n, s] = nll_rows(tr.logits[:n_scored], seqs[n][T - n_scored:]).mean()
    nll = out[:, 1:].reshape(n_texts, len(windows), len(keeps))
    return WindowedPerplexity(nll_full=out[:, 0], nll=nll, windows=windows, keeps=keeps, T=int(T),
                              n_scored=int(n_scored), bos=bool(bos), model=model.name,
                              extra={"own_windows": sorted({int(x) for x in model.config.window or ()})})
