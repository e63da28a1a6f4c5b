"""Sinks across a sequence of documents, beyond the paper: when n documents are concatenated into
one sequence (as in packed pretraining windows or retrieval prompts), with and without a ⟨bos⟩
at each document boundary, where do the sinks form: only at position 0, at every ⟨bos⟩, at every
document's first token, or nowhere in particular?

Question answered: does a model trained with a fixed ⟨bos⟩ (Gemma 3) make every ⟨bos⟩ a sink, and
what do models trained without one (SmolLM2, Qwen2.5) do with a ⟨bos⟩ or a document start in the
middle of a sequence?

Sequences (:func:`document_sequences`): prompt p concatenates n documents, each one shipped
passage cut to D text tokens (passages p·n … p·n + n − 1 of the ``"sinks"`` split, those with at
least D tokens). Position 0 follows the model's own ⟨bos⟩ rule (its tokenizer's
``add_bos_default``: ⟨bos⟩ + text for Gemma, text only for SmolLM2 and Qwen2.5). Conditions:

- ``"separated"``: the separator token (default the model's ⟨bos⟩ id, ``config.bos_token_id``:
  Gemma ``<bos>``, SmolLM2 ``<|im_start|>``, Qwen2.5 ``<|endoftext|>``, its pretraining document
  separator) in front of every document after the first;
- ``"concatenated"``: the documents back to back, nothing between them.

Measured per (prompt, layer, head), with Gu et al.'s importance a_k over the queries that see key
k (:func:`sinklab.analysis.secondary.column_mean`, from the C kernel's streamed statistic, so no
T x T matrix; exact under sliding windows): a_0; a at each later document's start s_j (the
separator when there is one, else the document's first token), j = 2..n; with a separator also a
at the token after it (the document's first text token); and the mean a_k over the other keys
(k not 0 nor a start nor after a separator, k <= T - min_queries). Sink indicators a > eps as in
the paper's sink rate. Mass shares m_k / T (m_k = sum_i A[i, k]) on position 0 and on the later
starts together say whether copies of a sink share one budget or add to it. Intervals are
bootstraps over prompts (:mod:`sinklab.analysis.stats`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..batching import run_each
from ..inputs import text_ids
from ..prompts import load_passages
from ..results import load_npz, save_npz, to_jsonable
from ..reprs import compact_repr
from .secondary import column_mass, column_mean, default_bos
from .stats import Interval, mean_ci, paired_difference, ratio_of_means

FORMAT = "sinklab.MultiDocSinks/1"
CONDITIONS = ("separated", "concatenated")
ARRAYS = ("a0", "a_start", "a_after", "a_rest", "rest_rate", "mass_first", "mass_starts")


def document_sequences(model: Any, n_docs: int, doc_tokens: int, n_prompts: int, bos: bool,
                       sep_id: Optional[int]) -> Tuple[np.ndarray, np.ndarray, List[List[int]]]:
    """(ids (P, T) int64, starts (n_docs - 1,) int64 positions of the later documents' starts,
    passage indices per prompt) for one condition: ``sep_id`` None concatenates the documents,
    else puts that token before every document after the first; ``bos`` puts the model's ⟨bos⟩ at
    position 0. Every prompt has the same layout, so the starts are shared."""
    for name, v, lo in (("n_docs", n_docs, 2), ("doc_tokens", doc_tokens, 2), ("n_prompts", n_prompts, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    passages = load_passages("sinks")
    docs, used = [], []
    for i, p in enumerate(passages):
        ids = text_ids(model, p)
        if len(ids) >= doc_tokens:
            docs.append(ids[:doc_tokens])
            used.append(i)
    if len(docs) < n_docs * n_prompts:
        raise ValueError(f"{n_prompts} prompts of {n_docs} documents need {n_docs * n_prompts} passages of at least "
                         f"{doc_tokens} tokens; the shipped set has {len(docs)}")
    head = [model.bos_id(True)] if bos else []
    seqs, groups = [], []
    for p in range(n_prompts):
        parts: List[int] = list(head)
        for j in range(n_docs):
            if j and sep_id is not None:
                parts.append(int(sep_id))
            parts.extend(int(t) for t in docs[p * n_docs + j])
        seqs.append(parts)
        groups.append(used[p * n_docs:(p + 1) * n_docs])
    step = doc_tokens + (1 if sep_id is not None else 0)
    starts = len(head) + doc_tokens + step * np.arange(n_docs - 1)
    ids = np.asarray(seqs, np.int64)
    if ids.shape[1] > model.config.context_length:
        raise ValueError(f"{ids.shape[1]} tokens exceed the context length {model.config.context_length}")
    return ids, starts.astype(np.int64), groups


def document_importance(importance: np.ndarray, windows: List[int], starts: np.ndarray, separated: bool,
                        min_queries: int, eps: float) -> Dict[str, np.ndarray]:
    """One sequence's a_0 (L, H), a at the later starts (n - 1, L, H), a after them (the same;
    NaN without separator), the mean a over the other keys (L, H) and their sink fraction
    (a > eps; (L, H)), and the shares of all attention mass on position 0 and on the later starts
    together (m_k / T summed; (L, H) each), from its C importance (L, H, T) and each layer's window."""
    imp = np.asarray(importance, np.float64)
    L, H, T = imp.shape
    a = np.stack([column_mean(imp[l], windows[l]) for l in range(L)])
    mass = column_mass(imp)
    special = np.zeros(T, bool)
    special[0] = True
    special[starts] = True
    if separated:
        special[starts + 1] = True
    rest = ~special
    rest[T - int(min_queries) + 1:] = False
    after = np.moveaxis(a[..., starts + 1], -1, 0) if separated else np.full((len(starts), L, H), np.nan)
    return {"a0": a[..., 0], "a_start": np.moveaxis(a[..., starts], -1, 0), "a_after": after,
            "a_rest": a[..., rest].mean(-1), "rest_rate": (a[..., rest] > eps).mean(-1),
            "mass_first": mass[..., 0] / T, "mass_starts": mass[..., starts].sum(-1) / T}


@compact_repr
@dataclass
class MultiDocSinks:
    """Sinks across concatenated documents (definitions in :mod:`sinklab.analysis.multidoc`).

    Attributes:
        data: per condition (``"separated"``, ``"concatenated"``): ``a0`` (P, L, H), ``a_start``
            (P, n-1, L, H), ``a_after`` (P, n-1, L, H; NaN when concatenated), ``a_rest`` (P, L, H),
            ``rest_rate`` (P, L, H), ``mass_first`` / ``mass_starts`` (P, L, H) the shares of all
            attention mass on position 0 / on the later starts together, ``ids`` (P, T_c),
            ``starts`` (n-1,).
        n_docs, doc_tokens, bos (⟨bos⟩ at position 0), sep_id, sep_token, eps, min_queries,
        model, windows, meta.
    """

    data: Dict[str, Dict[str, np.ndarray]]
    n_docs: int
    doc_tokens: int
    bos: bool
    sep_id: int
    sep_token: str
    eps: float
    min_queries: int
    model: str
    windows: List[int] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return int(self.data[CONDITIONS[0]]["a0"].shape[0])

    def rate(self, cond: str, where: str) -> Interval:
        """Sink rate (fraction of (layer, head) with a > eps) at ``where``: ``"first"`` (position
        0), ``"start"`` (the later documents' starts, averaged over them), ``"after"`` (the token
        after each separator) or ``"rest"`` (the other keys); interval over prompts."""
        d = self.data[cond]
        if where == "rest":
            return mean_ci(d["rest_rate"])
        key = {"first": "a0", "start": "a_start", "after": "a_after"}.get(where)
        if key is None:
            raise ValueError(f"where must be 'first', 'start', 'after' or 'rest', got {where!r}")
        return mean_ci((d[key] > self.eps).astype(np.float64)) if np.isfinite(d[key]).all() else \
            Interval(float("nan"), float("nan"), float("nan"), 0)

    def head_mean(self, cond: str, key: str) -> np.ndarray:
        """(P,): per prompt the mean over (document, layer, head) of ``key``'s a."""
        x = self.data[cond][key]
        return x.reshape(x.shape[0], -1).mean(axis=1)

    def layer_profile(self, cond: str, key: str) -> np.ndarray:
        """(P, L): per prompt and layer the mean over heads (and documents) of ``key``'s a."""
        x = self.data[cond][key]
        return x.mean(axis=(1, 3)) if x.ndim == 4 else x.mean(axis=2)

    def condition_summary(self, cond: str) -> Dict[str, Any]:
        """Means over heads with intervals over prompts: a at position 0, at the starts, after the
        separators and elsewhere; the sink rates there; start − rest and start / first."""
        m = {k: self.head_mean(cond, k) for k in ("a0", "a_start", "a_after", "a_rest", "mass_first", "mass_starts")}
        sep = cond == "separated"
        return {"a0": mean_ci(m["a0"]).to_dict(), "a_start": mean_ci(m["a_start"]).to_dict(),
                "a_after": mean_ci(m["a_after"]).to_dict() if sep else None, "a_rest": mean_ci(m["a_rest"]).to_dict(),
                "rate_first": self.rate(cond, "first").to_dict(), "rate_start": self.rate(cond, "start").to_dict(),
                "rate_after": self.rate(cond, "after").to_dict() if sep else None,
                "rate_rest": self.rate(cond, "rest").to_dict(),
                "start_minus_rest": paired_difference(m["a_rest"], m["a_start"]).to_dict(),
                "start_over_first": ratio_of_means(m["a_start"], m["a0"]).to_dict(),
                "mass_first": mean_ci(m["mass_first"]).to_dict(), "mass_starts": mean_ci(m["mass_starts"]).to_dict(),
                "mass_sinks": mean_ci(m["mass_first"] + m["mass_starts"]).to_dict(),
                "ids_len": int(self.data[cond]["ids"].shape[1])}

    def summary(self) -> Dict[str, Any]:
        return to_jsonable({"model": self.model, "n_docs": self.n_docs, "doc_tokens": self.doc_tokens, "bos": self.bos,
                            "sep_id": self.sep_id, "sep_token": self.sep_token, "eps": self.eps,
                            "n_prompts": self.n_prompts,
                            **{c: self.condition_summary(c) for c in CONDITIONS}})

    def __str__(self) -> str:
        s = {c: self.head_mean(c, "a_start").mean() for c in CONDITIONS}
        return (f"MultiDocSinks({self.model}, {self.n_prompts} prompts of {self.n_docs} x {self.doc_tokens} tokens: "
                f"mean a at the later documents' starts {s['separated']:.3f} with {self.sep_token!r} before them, "
                f"{s['concatenated']:.3f} without; a_0 {self.head_mean('separated', 'a0').mean():.3f})")

    # ------------------------------------------------------------------ persistence
    def save(self, path: Union[str, os.PathLike]) -> str:
        """Writes an ``.npz`` (arrays + JSON metadata, no pickle); returns the file written."""
        arrays = {f"{c}__{k}": v for c in CONDITIONS for k, v in self.data[c].items()}
        meta = {"format": FORMAT, "n_docs": self.n_docs, "doc_tokens": self.doc_tokens, "bos": self.bos,
                "sep_id": self.sep_id, "sep_token": self.sep_token, "eps": self.eps, "min_queries": self.min_queries,
                "model": self.model, "windows": list(self.windows), "meta": self.meta}
        return save_npz(path, arrays, meta)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "MultiDocSinks":
        arrays, d = load_npz(path)
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved MultiDocSinks (format {d.get('format')!r}, expected {FORMAT!r})")
        data: Dict[str, Dict[str, np.ndarray]] = {c: {} for c in CONDITIONS}
        for k, v in arrays.items():
            c, name = k.split("__", 1)
            data[c][name] = v
        return cls(data=data, n_docs=int(d["n_docs"]), doc_tokens=int(d["doc_tokens"]), bos=bool(d["bos"]),
                   sep_id=int(d["sep_id"]), sep_token=str(d["sep_token"]), eps=float(d["eps"]),
                   min_queries=int(d["min_queries"]), model=str(d["model"]), windows=[int(w) for w in d["windows"]],
                   meta=d.get("meta", {}))


def multidoc_sinks(model: Any, n_docs: int = 4, doc_tokens: int = 96, n_prompts: int = 8,
                   bos: Optional[bool] = None, sep_id: Optional[int] = None, eps: float = 0.3,
                   min_queries: int = 16, progress: bool = True,
                   batch_bytes: Optional[int] = None) -> MultiDocSinks:
    """Where sinks form when ``n_docs`` documents are concatenated, with and without a separator
    token at each boundary (definitions in the module docstring).

    Args:
        model: a causal :class:`sinklab.Model` with a ⟨bos⟩ token (or pass ``sep_id``).
        n_docs: documents per sequence (>= 2). doc_tokens: text tokens per document.
        n_prompts: sequences (the units of every interval); each uses its own n_docs passages.
        bos: the model's ⟨bos⟩ at position 0; None: the model's own rule (tokenizer's
            ``add_bos_default``).
        sep_id: the token put at each boundary in the ``"separated"`` condition (default the
            model's ⟨bos⟩ id).
        eps: the sink threshold on a. min_queries: "other" keys are seen by at least this many
            queries. progress: tqdm bars. batch_bytes: the forward's memory cap per call.

    Returns:
        A :class:`MultiDocSinks`.
    """
    c = model.config
    if c.bidirectional:
        raise ValueError(f"{model.name} is bidirectional: document sinks are defined here for causal models")
    if not 0.0 < float(eps) < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    if sep_id is None:
        sep_id = model.bos_id(True)
    if isinstance(sep_id, bool) or not isinstance(sep_id, (int, np.integer)) or not 0 <= sep_id < c.vocab_size:
        raise ValueError(f"sep_id must be a token id in [0, {c.vocab_size}), got {sep_id!r}")
    bos = default_bos(model) if bos is None else bool(bos)
    windows = [c.layer_window(l) for l in range(c.n_layers)]
    data: Dict[str, Dict[str, np.ndarray]] = {}
    for cond in CONDITIONS:
        sep = cond == "separated"
        ids, starts, groups = document_sequences(model, n_docs, doc_tokens, n_prompts, bos, sep_id if sep else None)
        if ids.shape[1] < int(min_queries) + starts[-1] + 2:
            raise ValueError(f"min_queries={min_queries} leaves no other keys after the last document start")
        per: Dict[str, List[Any]] = {k: [None] * len(ids) for k in ARRAYS}
        for p, tr in run_each(model, ids, ("stats",), logits_from=-1, batch_bytes=batch_bytes, progress=progress,
                              desc=f"documents ({cond})", unit="prompt"):
            for k, v in document_importance(tr.stats.importance, windows, starts, sep, min_queries, eps).items():
                per[k][p] = v
        data[cond] = {k: np.stack(v) for k, v in per.items()}
        data[cond].update(ids=ids, starts=starts)
    return MultiDocSinks(data=data, n_docs=int(n_docs), doc_tokens=int(doc_tokens), bos=bos, sep_id=int(sep_id),
                         sep_token=model.tokenizer.decode([int(sep_id)]), eps=float(eps), min_queries=int(min_queries),
                         model=model.name, windows=windows,
                         meta={"passages": groups, "bos_token_id": c.bos_token_id,
                               "tokenizer_adds_bos": getattr(model.tokenizer, "add_bos_default", None)})
