"""The standard activation-patching experiment (denoising): run a clean prompt and a corrupted
one of the same token length, then patch one activation of the clean run into the corrupted run
at a time, per (layer, position) for the stream points or per (layer, head) for the head points,
and measure how much of the clean logit difference comes back.

For a pair with answer token a and wrong token w, the logit difference of a run is
ld = logit[a] - logit[w] at the last position, and a patch's recovered share is

    recovered = (ld_patched - ld_corrupted) / (ld_clean - ld_corrupted)

so 0 is the corrupted run and 1 the clean one (TransformerLens's ``patching`` module and the
IOI / ROME causal-tracing papers normalise the same way). With several pairs, each cell's mean
has a 95 % bootstrap interval over pairs (:func:`~sinklab.analysis.stats.mean_ci`). A pair whose
clean and corrupted differences are equal (|ld_clean - ld_corrupted| < 1e-6) has no scale: its
cells are NaN and left out of the means.

The patched runs are batched: every (layer, index) cell of every pair is one row of a batch of
corrupted prompts, each row carrying its own :class:`~sinklab.patching.Patch`, so one C forward
runs ``batch`` cells at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..patching import POINTS, STREAM_POINTS, Patch
from ..progress import progress_bar
from ..reprs import compact_repr
from .stats import Interval, mean_ci


@compact_repr
@dataclass
class PatchingResult:
    """What :func:`patching_experiment` returns.

    Attributes:
        over: the point patched (``resid``, ``attn_out``, ``mlp_out``: per position; ``head_out``,
            ``z``, ``q``, ``k``, ``v``, ``pattern``: per head, every position at once).
        axis: ``"position"`` or ``"head"``.
        layers: the layers patched (L' of them); ``index``: the positions or heads (X of them).
        recovered: (N, L', X) the recovered share per pair, NaN for a pair without scale.
        patched_diff: (N, L', X) the patched runs' logit differences (logits, nats).
        clean_diff, corrupted_diff: (N,) the two unpatched runs' logit differences.
        mean, lo, hi: (L', X) mean over pairs of ``recovered`` and its 95 % bootstrap interval
            (lo, hi NaN with fewer than 2 pairs).
        model, T: the model's name and the prompts' token length; ``tokens``: the first clean
            prompt's tokens, for axis labels.
    """

    over: str
    axis: str
    layers: List[int]
    index: List[int]
    recovered: np.ndarray
    patched_diff: np.ndarray
    clean_diff: np.ndarray
    corrupted_diff: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    model: str
    T: int
    tokens: List[str]

    def cell(self, layer: int, index: int) -> Interval:
        """The interval of cell (layer, position or head) over pairs."""
        li, xi = self.layers.index(layer), self.index.index(index)
        return mean_ci(self.recovered[:, li, xi], seed=0)


def _pairs(clean_ids: Any, corrupted_ids: Any) -> Tuple[np.ndarray, np.ndarray]:
    clean, corr = np.atleast_2d(np.asarray(clean_ids)), np.atleast_2d(np.asarray(corrupted_ids))
    if clean.ndim != 2 or clean.shape != corr.shape:
        raise ValueError(f"clean_ids {clean.shape} and corrupted_ids {corr.shape} must be the same (T,) or (N, T) "
                         f"shape: each pair has the same token length")
    if not (np.issubdtype(clean.dtype, np.integer) and np.issubdtype(corr.dtype, np.integer)):
        raise ValueError("clean_ids and corrupted_ids must be integer token ids")
    return clean.astype(np.int64), corr.astype(np.int64)


def _tokens(x: Any, N: int, V: int, name: str) -> np.ndarray:
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.integer) or a.ndim > 1 or (a.ndim == 1 and a.shape != (N,)):
        raise ValueError(f"{name} must be a token id or {N} token ids (one per pair), got {x!r}")
    a = np.broadcast_to(a.astype(np.int64), (N,))
    if a.min() < 0 or a.max() >= V:
        raise ValueError(f"{name} token ids must be in [0, {V})")
    return a


def logit_diff(logits: np.ndarray, answer: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """(n,) logit[answer] - logit[wrong] of the last position of logits (n, t, V), float64."""
    last = logits[:, -1].astype(np.float64)
    r = np.arange(last.shape[0])
    return last[r, answer] - last[r, wrong]


def _cells(model: Any, over: str, T: int, layers: Optional[Sequence[int]], index: Optional[Sequence[int]]):
    c = model.config
    top = c.n_layers if over == "resid" else c.n_layers - 1
    lay = list(range(c.n_layers)) if layers is None else [int(x) for x in layers]
    bad = [x for x in lay if not 0 <= x <= top]
    if bad or not lay:
        raise ValueError(f"layers {bad or lay} outside [0, {top}] for {over!r}")
    if over in STREAM_POINTS:
        n, axis = T, "position"
    else:
        n, axis = (c.n_kv_heads if over in ("k", "v") else c.n_heads), "head"
    idx = list(range(n)) if index is None else [int(x) for x in index]
    bad = [x for x in idx if not 0 <= x < n]
    if bad or not idx:
        raise ValueError(f"{axis}s {bad or idx} outside [0, {n})")
    return lay, idx, axis


def _clean_values(model: Any, clean: np.ndarray, over: str, lay: List[int]) -> Dict[int, np.ndarray]:
    """layer -> (N, X, ...) the clean activations patched in: (N, T, d) for a stream point,
    (N, heads, T, width) for a head point."""
    if over == "resid":
        tr = model.run(clean, capture=("resid",), progress=False)
        return {l: tr.resid[:, l] for l in lay}
    name = "attn" if over == "pattern" else over
    tr = model.run(clean, capture=(name,), layers=sorted(set(lay)), progress=False)
    arr = getattr(tr, name)
    return {l: arr[:, tr.layers.index(l)] for l in lay}


def patching_experiment(model: Any, clean_ids: Any, corrupted_ids: Any, answer: Any, wrong: Any,
                        over: str = "resid", layers: Optional[Sequence[int]] = None,
                        index: Optional[Sequence[int]] = None, batch: int = 64,
                        progress: bool = True) -> PatchingResult:
    """Patches each (layer, position) or (layer, head) of the clean run into the corrupted run.

    Args:
        model: a :class:`sinklab.Model`.
        clean_ids, corrupted_ids: (T,) or (N, T) token ids, pair n being row n of each.
        answer, wrong: the clean answer's and the competing token's id, one for all pairs or (N,).
        over: the point patched: a stream point (``resid``, ``attn_out``, ``mlp_out``), one patch per
            (layer, position), or a head point (``head_out``, ``z``, ``q``, ``k``, ``v``,
            ``pattern``), one patch per (layer, head) covering every position of that head.
        layers: the layers patched (default every layer 0..L-1; ``resid`` also takes L).
        index: the positions (stream points) or heads (head points) patched, default all.
        batch: patched runs per C forward call.
        progress: a progress bar over the batches.

    Returns:
        A :class:`PatchingResult`.
    """
    if over not in POINTS:
        raise ValueError(f"over={over!r}; expected one of {POINTS}")
    if int(batch) < 1:
        raise ValueError(f"batch={batch} must be >= 1")
    clean, corr = _pairs(clean_ids, corrupted_ids)
    N, T = clean.shape
    V = model.config.vocab_size
    ans, wr = _tokens(answer, N, V, "answer"), _tokens(wrong, N, V, "wrong")
    lay, idx, axis = _cells(model, over, T, layers, index)
    ld_clean = logit_diff(model.run(clean, capture=("logits",), logits_from=-1, progress=False).logits, ans, wr)
    ld_corr = logit_diff(model.run(corr, capture=("logits",), logits_from=-1, progress=False).logits, ans, wr)
    values = _clean_values(model, clean, over, lay)
    cells = [(n, li, xi) for n in range(N) for li in range(len(lay)) for xi in range(len(idx))]
    patched = np.empty((N, len(lay), len(idx)))
    starts = range(0, len(cells), int(batch))
    for s in progress_bar(starts, progress, desc=f"patching {over} ({len(cells)} runs)", unit="batch"):
        chunk = cells[s:s + int(batch)]
        patches = [_patch(over, values[lay[li]][n], lay[li], idx[xi], r) for r, (n, li, xi) in enumerate(chunk)]
        rows = np.array([n for n, _, _ in chunk])
        tr = model.run(corr[rows], capture=("logits",), logits_from=-1, patch=patches, progress=False)
        got = logit_diff(tr.logits, ans[rows], wr[rows])
        for (n, li, xi), g in zip(chunk, got):
            patched[n, li, xi] = g
    scale = ld_clean - ld_corr
    ok = np.abs(scale) >= 1e-6
    rec = np.full_like(patched, np.nan)
    rec[ok] = (patched[ok] - ld_corr[ok, None, None]) / scale[ok, None, None]
    mean, lo, hi = _intervals(rec)
    return PatchingResult(over=over, axis=axis, layers=lay, index=idx, recovered=rec, patched_diff=patched,
                          clean_diff=ld_clean, corrupted_diff=ld_corr, mean=mean, lo=lo, hi=hi,
                          model=str(model.name or model.source), T=T,
                          tokens=[model.detokenize([int(t)]) for t in clean[0]])


def _patch(over: str, clean_act: np.ndarray, layer: int, x: int, row: int) -> Patch:
    """Row ``row``'s patch: the clean activation at position x (stream) or of head x (all positions)."""
    if over in STREAM_POINTS:
        return Patch(over, clean_act[x][None], layer=layer, positions=[x], rows=[row])
    return Patch(over, clean_act[x][None], layer=layer, heads=[x], rows=[row])


def _intervals(rec: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    shape = rec.shape[1:]
    mean, lo, hi = (np.full(shape, np.nan) for _ in range(3))
    for li in range(shape[0]):
        for xi in range(shape[1]):
            iv = mean_ci(rec[:, li, xi], seed=0)
            mean[li, xi], lo[li, xi], hi[li, xi] = iv.value, iv.lo, iv.hi
    return mean, lo, hi


NAME_SWAP_TEMPLATES = (
    "When {A} and {B} went to the store, {S} gave a drink to",
    "After {A} and {B} went to the park, {S} gave a ball to",
    "While {A} and {B} were working at the office, {S} handed a book to",
    "Then {A} and {B} had dinner at the house, and {S} passed the salt to",
    "Once {A} and {B} arrived at the school, {S} sent a letter to",
    "Later {A} and {B} walked to the station, where {S} gave a ticket to",
)
"""Indirect-object templates (Wang et al. 2022, "Interpretability in the wild"): {A} is the
indirect object (the answer), {B} the subject, {S} the subject's second mention."""

NAMES = ("Mary", "John", "Tom", "Anna", "James", "Sarah", "David", "Emma", "Paul", "Lisa", "Mark", "Kate")


def name_swap_pairs(model: Any, n: int, bos: Optional[bool] = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                                np.ndarray]:
    """``n`` IOI-style clean/corrupted pairs built with ``model``'s tokenizer: clean
    "When A and B ..., B gave a drink to" (answer A, the indirect object), corrupted "..., A gave a
    drink to" (the second mention swapped, so the answer becomes B); answer A, wrong B. Only names
    that are one token after a space are used, and only pairs whose two prompts have the same
    token length; templates and name pairs are taken in a fixed order.

    Args:
        model: a :class:`sinklab.Model`.
        n: number of pairs (ValueError when the tokenizer leaves fewer).
        bos: start with the model's ⟨bos⟩ (default: the tokenizer's own rule).

    Returns:
        clean (n, T), corrupted (n, T) int64 token ids, answer (n,), wrong (n,); T is that of the
        shortest template that gives pairs (every pair the same T, so they batch).
    """
    if bos is None:
        bos = bool(getattr(model.tokenizer, "add_bos_default", True))
    one = {nm: model.tokenize(" " + nm) for nm in NAMES}
    names = [nm for nm in NAMES if len(one[nm]) == 1]
    by_len: Dict[int, List[Tuple[np.ndarray, np.ndarray, int, int]]] = {}
    for tpl in NAME_SWAP_TEMPLATES:
        for i in range(0, len(names) - 1, 2):
            a, b = names[i], names[i + 1]
            for x, y in ((a, b), (b, a)):
                c = model.tokenize(tpl.format(A=x, B=y, S=y), bos=bos)
                k = model.tokenize(tpl.format(A=x, B=y, S=x), bos=bos)
                if len(c) == len(k):
                    by_len.setdefault(len(c), []).append((c, k, int(one[x][0]), int(one[y][0])))
    best = max(by_len.values(), key=len, default=[])
    if len(best) < n:
        raise ValueError(f"{model.name}: only {len(best)} name-swap pairs of one token length, {n} asked for")
    got = best[:n]
    return (np.stack([g[0] for g in got]).astype(np.int64), np.stack([g[1] for g in got]).astype(np.int64),
            np.array([g[2] for g in got], np.int64), np.array([g[3] for g in got], np.int64))
