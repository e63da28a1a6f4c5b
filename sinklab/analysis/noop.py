"""Sinks as approximate no-ops (the paper's §3.2–3.3): value norms, head-output norms, sink mass, and a
search for "conditional" heads.

For layer l, query head h (it reads kv head g = h // (H / G)):

    value norm          ||v_j^g||_2, v the values of the forward (``Trace.v``)      (L, H, T)
    head output         o_i^h, head h's addition to the residual stream at query i
                        (``Trace.head_out``: z_i^h = sum_k A_ik^h v_k^g times W_O's columns of h)
    head-output norm    ||o_i^h||_2                                                 (L, H, T), residual-stream units
    to_first            A_i0^h, the attention of query i to position 0 (``Trace.attn``)

Everything is read from the C forward's captures, nothing is recomputed from the weight arrays,
so the numbers are those of the model as it ran (norm offsets, biases or interventions
included).

The paper's claim: a head with nothing to do puts its attention on position 0 (⟨bos⟩), whose
value vector is small, so its update to the residual stream is ≈ 0. Per head this module reports
the correlation across queries between to_first and the head-output norm (negative: the more the
head sinks, the smaller its output), the ratio of the position-0 value norm to the median value
norm of the other tokens, and the head-output norm relative to the residual stream it is added to.

Queries: statistics over queries skip query 0 (its only key is position 0 itself).

GQA: query heads that share one kv head (SmolLM2: 9 query heads, 3 kv heads) see the same value
vectors, so comparisons of value norms are made per kv head, not per query head (which would
count one value head up to H/G times): :meth:`NoopResult.kv_first_value_ratio` is (L, G), and a
kv head is a *sink kv head* when the majority (more than half) of its query heads are sink
heads (:meth:`NoopResult.kv_sink_heads`; ``"any"`` and ``"all"`` are options, and
:meth:`NoopResult.summary` reports all three). Attention, head outputs and their norms are per
query head (each query head has its own attention row and its own W_O^h slice).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..inputs import condition, prepare, text_ids
from ..batching import run_each
from ..results import load_npz, save_npz, to_jsonable
from . import status as S
from .stats import mean_ci
from ..reprs import compact_repr
from ..labels import long_frame

TextLike = Union[str, Sequence[int], np.ndarray]
KV_RULES = ("majority", "any", "all")


# ---------------------------------------------------------------------------------- primitives
def value_norms(model: Any, v: np.ndarray) -> np.ndarray:
    """||v_j^g||_2 per layer, query head and token: (L, H, T) float64.

    ``v``: (L, G, T, hd) values of every layer per kv head (``Trace.v`` captured with all
    layers). Query head h reads kv head g = h // (H/G); query heads sharing a kv head (GQA) get
    the same (repeated) norms, so ``out[:, ::H//G]`` is the (L, G, T) per-kv-head array.
    """
    c = model.config
    a = np.asarray(v)
    if a.ndim != 4 or a.shape[:2] != (c.n_layers, c.n_kv_heads) or a.shape[3] != c.head_dim:
        raise ValueError(f"v must have shape (L={c.n_layers}, G={c.n_kv_heads}, T, hd={c.head_dim}) "
                         f"(Trace.v of every layer), got {a.shape}")
    norms = np.linalg.norm(a.astype(np.float64), axis=-1)                       # (L, G, T)
    return np.repeat(norms, c.n_heads // c.n_kv_heads, axis=1)


def head_output_norms(model: Any, head_out: np.ndarray) -> np.ndarray:
    """||o_i^h||_2 per layer, query head and query: (L, H, T) float64, residual-stream units.

    ``head_out``: (L, H, T, d) each head's addition to the residual stream (``Trace.head_out``
    captured with all layers).
    """
    c = model.config
    a = np.asarray(head_out)
    if a.ndim != 4 or a.shape[:2] != (c.n_layers, c.n_heads) or a.shape[3] != c.d_model:
        raise ValueError(f"head_out must have shape (L={c.n_layers}, H={c.n_heads}, T, d={c.d_model}) "
                         f"(Trace.head_out of every layer), got {a.shape}")
    return np.linalg.norm(a.astype(np.float64), axis=-1)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    y = y - y.mean()
    d = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / d) if d > 0 else float("nan")


def _rankdata(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # average ties
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


# ---------------------------------------------------------------------------------- no-op analysis
@compact_repr
@dataclass
class NoopResult:
    """Per-prompt value norms, head-output norms and attention to position 0.

    Attributes:
        ids: list of (T_p,) int64 sequences as run (BOS included when used).
        value_norm: list of (L, H, T_p) float64 ||v_j^g|| per query head h (repeated over
            the H/G query heads of kv head g; see :meth:`kv_value_norm`).
        out_norm: list of (L, H, T_p) float64 head-output norm per query head and query.
        to_first: list of (L, H, T_p) float64 attention of each query to position 0.
        resid_norm: list of (L, T_p) float64 ||v_i^(l)||, the stream each head output is added to.
        meta: model, BOS id, setting, ``n_kv_heads`` (G).
    """

    ids: List[np.ndarray]
    value_norm: List[np.ndarray]
    out_norm: List[np.ndarray]
    to_first: List[np.ndarray]
    resid_norm: List[np.ndarray]
    meta: Dict[str, Any] = field(default_factory=dict)


    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per (layer, head), of the per-head summaries over queries
        i >= 1 of every prompt: ``sink_mass`` (mean attention to position 0), ``mean_out_norm``,
        ``rel_out_norm`` (head output over residual norm) and ``correlation`` (Pearson, between
        attention to position 0 and head-output norm), with ``model``."""
        return long_frame({"sink_mass": self.sink_mass(), "mean_out_norm": self.mean_out_norm(),
                           "rel_out_norm": self.rel_out_norm(), "correlation": self.correlation()},
                          ("layer", "head"), model=self.meta.get("model"))

    def _pooled(self, arrs: List[np.ndarray]) -> np.ndarray:
        """(L, H, N) over queries 1..T_p-1 of every prompt."""
        return np.concatenate([a[..., 1:] for a in arrs], axis=-1)

    def sink_mass(self) -> np.ndarray:
        """(L, H): mean attention to position 0 over queries i >= 1 of all prompts."""
        return self._pooled(self.to_first).mean(axis=-1)

    def mean_out_norm(self) -> np.ndarray:
        """(L, H): mean head-output norm over queries i >= 1."""
        return self._pooled(self.out_norm).mean(axis=-1)

    def rel_out_norm(self) -> np.ndarray:
        """(L, H): mean over queries i >= 1 of ||o_i^h|| / ||v_i^(l)||."""
        rel = [o / r[:, None, :] for o, r in zip(self.out_norm, self.resid_norm)]
        return self._pooled(rel).mean(axis=-1)

    def correlation(self, method: str = "pearson") -> np.ndarray:
        """(L, H): correlation across queries i >= 1 between to_first and head-output norm.

        ``method``: ``"pearson"`` or ``"spearman"``. NaN where either is constant.
        """
        if method not in ("pearson", "spearman"):
            raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
        f, o = self._pooled(self.to_first), self._pooled(self.out_norm)
        L, H, _ = f.shape
        out = np.empty((L, H))
        for l in range(L):
            for h in range(H):
                x, y = f[l, h], o[l, h]
                if method == "spearman":
                    x, y = _rankdata(x), _rankdata(y)
                out[l, h] = _pearson(x, y)
        return out

    @property
    def n_kv_heads(self) -> int:
        """G, the number of kv heads (``meta["n_kv_heads"]``)."""
        if "n_kv_heads" not in self.meta:
            raise ValueError("this result does not record n_kv_heads (meta['n_kv_heads']); rerun noop_analysis")
        return int(self.meta["n_kv_heads"])

    def kv_value_norm(self) -> List[np.ndarray]:
        """Per prompt, (L, G, T_p) float64 value norms per kv head (one copy per value head)."""
        H = self.value_norm[0].shape[1]
        G = self.n_kv_heads
        return [v[:, ::H // G] for v in self.value_norm]

    def first_value_ratio(self) -> np.ndarray:
        """(L, H): ||value of position 0|| / median ||value|| of positions 1.., averaged over
        prompts, per *query* head: query heads of one kv head repeat the same number, so compare
        groups with :meth:`kv_first_value_ratio` instead."""
        r = [v[..., 0] / np.median(v[..., 1:], axis=-1) for v in self.value_norm if v.shape[-1] > 1]
        return np.mean(r, axis=0)

    def kv_first_value_ratio(self) -> np.ndarray:
        """(L, G): ||value of position 0|| / median ||value|| of positions 1.., averaged over
        prompts, per kv head (each value head counted once)."""
        r = [v[..., 0] / np.median(v[..., 1:], axis=-1) for v in self.kv_value_norm() if v.shape[-1] > 1]
        return np.mean(r, axis=0)

    def first_value_is_smallest(self) -> np.ndarray:
        """(L, G): per kv head, the fraction of prompts where position 0 has the smallest value
        norm of all tokens."""
        return np.mean([v[..., 0] <= v[..., 1:].min(axis=-1) for v in self.kv_value_norm() if v.shape[-1] > 1],
                       axis=0)

    def kv_sink_heads(self, eps: float = 0.5, rule: str = "majority") -> np.ndarray:
        """(L, G) bool: kv heads whose query heads are sink heads (sink mass > ``eps``).

        ``rule``: ``"majority"`` (default: more than half of its H/G query heads), ``"any"``
        (at least one) or ``"all"``.
        """
        if rule not in KV_RULES:
            raise ValueError(f"rule must be one of {KV_RULES}, got {rule!r}")
        sink = self.sink_mass() > eps                                   # (L, H)
        L, H = sink.shape
        n = sink.reshape(L, self.n_kv_heads, H // self.n_kv_heads).sum(axis=-1)
        rep = H // self.n_kv_heads
        return {"majority": n * 2 > rep, "any": n >= 1, "all": n == rep}[rule]

    def summary(self, eps: float = 0.5, kv_rule: str = "majority") -> Dict[str, Any]:
        """Do sink heads (sink mass > ``eps``) have small outputs? JSON-ready numbers.

        Per query head (``*_sink_heads`` / ``*_other_heads``, ``n_heads``): head-output norms
        and correlations. Per kv head (``*_kv_heads``, ``n_kv_heads``): value-norm ratios, with
        sink kv heads chosen by ``kv_rule`` (:meth:`kv_sink_heads`); ``kv_groups`` gives the
        counts and medians under every rule.
        """
        mass, rel = self.sink_mass(), self.rel_out_norm()
        corr, kv_ratio = self.correlation(), self.kv_first_value_ratio()
        sink = mass > eps
        med = lambda a: float(np.nanmedian(a)) if a.size else float("nan")  # noqa: E731
        all_mass, all_rel = mass.ravel(), rel.ravel()
        groups = {}
        for rule in KV_RULES:
            k = self.kv_sink_heads(eps, rule)
            groups[rule] = {"n_sink_kv_heads": int(k.sum()), "n_other_kv_heads": int((~k).sum()),
                            "median_first_value_ratio_sink_kv_heads": med(kv_ratio[k]),
                            "median_first_value_ratio_other_kv_heads": med(kv_ratio[~k])}
        kv_sink = self.kv_sink_heads(eps, kv_rule)
        return to_jsonable({
            "meta": self.meta, "eps": eps, "n_prompts": len(self.ids),
            "n_heads": int(mass.size), "n_sink_heads": int(sink.sum()),
            "median_rel_out_norm_sink_heads": med(rel[sink]),
            "median_rel_out_norm_other_heads": med(rel[~sink]),
            "spearman_sink_mass_vs_rel_out_norm_across_heads":
                _pearson(_rankdata(all_mass), _rankdata(all_rel)),
            "median_query_corr_to_first_vs_out_norm_sink_heads": med(corr[sink]),
            "median_query_corr_to_first_vs_out_norm_other_heads": med(corr[~sink]),
            "fraction_heads_negative_query_corr": float(np.nanmean(corr < 0)),
            "kv_rule": kv_rule, "n_kv_heads": int(kv_ratio.size),
            **groups[kv_rule], "kv_groups": groups,
            "fraction_kv_heads_first_value_smallest": float(self.first_value_is_smallest().mean()),
            "per_head": {"sink_mass": mass, "rel_out_norm": rel, "mean_out_norm": self.mean_out_norm(),
                         "query_corr": corr},
            "per_kv_head": {"first_value_ratio": kv_ratio, "sink": kv_sink,
                            "n_sink_query_heads": (sink.reshape(kv_sink.shape + (-1,))).sum(axis=-1)},
        })

    def save(self, path: str) -> None:
        """.npz (per-prompt arrays concatenated along T, with offsets) + JSON metadata; no pickle."""
        offs = np.cumsum([0] + [len(i) for i in self.ids]).astype(np.int64)
        save_npz(path, {"offsets": offs, "ids": np.concatenate(self.ids),
                        "value_norm": np.concatenate(self.value_norm, axis=-1),
                        "out_norm": np.concatenate(self.out_norm, axis=-1),
                        "to_first": np.concatenate(self.to_first, axis=-1),
                        "resid_norm": np.concatenate(self.resid_norm, axis=-1)}, {"meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "NoopResult":
        a, m = load_npz(path)
        o = a["offsets"]
        sl = [slice(int(o[i]), int(o[i + 1])) for i in range(len(o) - 1)]
        return cls(ids=[a["ids"][s] for s in sl], value_norm=[a["value_norm"][..., s] for s in sl],
                   out_norm=[a["out_norm"][..., s] for s in sl], to_first=[a["to_first"][..., s] for s in sl],
                   resid_norm=[a["resid_norm"][..., s] for s in sl], meta=dict(m["meta"]))


def _as_list(texts: Union[TextLike, Sequence[TextLike]]) -> List[TextLike]:
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, np.ndarray) and texts.ndim == 1:
        return [texts]
    if isinstance(texts, (list, tuple)) and texts and all(isinstance(t, (int, np.integer)) for t in texts):
        return [np.asarray(texts)]
    out = list(texts)
    if not out:
        raise ValueError("no prompts given")
    return out


def noop_analysis(model: Any, texts: Union[TextLike, Sequence[TextLike]], bos: bool = True,
                  max_tokens: Optional[int] = None, progress: bool = True,
                  batch_bytes: Optional[int] = None) -> NoopResult:
    """Value norms, head-output norms and attention to position 0 over a set of prompts.

    Args:
        model: a :class:`sinklab.Model`.
        texts: a prompt (str or text ids without BOS) or a list of them.
        bos: prepend the model's BOS token (position 0 is then BOS, else the first text token).
        max_tokens: cut each prompt to ``max_tokens`` tokens, the BOS included
            (:func:`sinklab.inputs.prepare`'s rule).
        progress: tqdm bar over prompts.
        batch_bytes: cap in bytes on one forward call's captures (attention, residual stream,
            values, per-head outputs: 40 MB a prompt of 64 tokens on SmolLM2-135M); prompts run
            together (zero-padded to the longest, with explicit lengths) as many as fit (default
            :data:`sinklab.batching.BATCH_BYTES`, 256 MiB). Bitwise the same for any cap.

    Returns:
        :class:`NoopResult`: per prompt (L, H, T_p) value norms (per query head, repeated within
        a kv head), head-output norms and attention to position 0 per query head; summaries per
        query head (outputs) and per kv head (values) via :meth:`NoopResult.summary`.
    """
    setting = condition(bos)
    seqs = [prepare(model, t, setting, max_tokens) for t in _as_list(texts)]
    if any(len(ids) < 2 for ids in seqs):
        raise ValueError("each prompt needs at least 2 tokens (queries after position 0)")
    rows: Dict[str, list] = {"ids": seqs}
    rows.update({k: [None] * len(seqs) for k in ("value_norm", "out_norm", "to_first", "resid_norm")})
    for i, tr in run_each(model, seqs, ("attn", "resid", "v", "head_out"), batch_bytes=batch_bytes,
                          progress=progress, desc="no-op analysis", unit="prompt", ragged=True):
        rows["value_norm"][i] = value_norms(model, tr.v)
        rows["out_norm"][i] = head_output_norms(model, tr.head_out)
        rows["to_first"][i] = np.asarray(tr.attn[..., :, 0], dtype=np.float64)
        rows["resid_norm"][i] = np.linalg.norm(np.asarray(tr.resid[:-1], dtype=np.float64), axis=-1)
    meta = {"model": getattr(model, "name", None), "bos_token_id": model.config.bos_token_id if bos else None,
            "setting": setting, "max_tokens": max_tokens, "n_heads": model.config.n_heads,
            "n_kv_heads": model.config.n_kv_heads}
    return NoopResult(meta=meta, **rows)


# ---------------------------------------------------------------------------------- conditional heads
@compact_repr
@dataclass
class ConditionalHeads:
    """Heads that attend to a trigger token when it is present and to position 0 when it is not.

    All per-head arrays are (L, H) float64, means over prompts:
        to_trigger_with: attention of the queries after the trigger to the trigger token(s).
        to_first_with: attention of those same queries to position 0.
        to_first_without: attention of queries i >= 1 to position 0 in the trigger-free prompts.
        to_prev_without: attention of queries i >= 2 to the previous token i-1 in the trigger-free
            prompts (a control: a previous-token head also "attends to the trigger" with window=1).
        out_norm_with / out_norm_without: mean head-output norm over the same queries.
        score: to_trigger_with * to_first_without (the ranking).
    ``top``: the best ``n_top`` heads as dicts with their numbers.
    """

    trigger: str
    trigger_ids: List[int]
    to_trigger_with: np.ndarray
    to_first_with: np.ndarray
    to_first_without: np.ndarray
    to_prev_without: np.ndarray
    out_norm_with: np.ndarray
    out_norm_without: np.ndarray
    n_top: int = 10
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> np.ndarray:
        return self.to_trigger_with * self.to_first_without

    @property
    def top(self) -> List[Dict[str, Any]]:
        s = self.score
        order = np.argsort(-s, axis=None, kind="stable")[: self.n_top]
        out = []
        for flat in order:
            l, h = np.unravel_index(flat, s.shape)
            out.append({"layer": int(l), "head": int(h), "score": float(s[l, h]),
                        "to_trigger_with": float(self.to_trigger_with[l, h]),
                        "to_first_with": float(self.to_first_with[l, h]),
                        "to_first_without": float(self.to_first_without[l, h]),
                        "to_prev_without": float(self.to_prev_without[l, h]),
                        "out_norm_with": float(self.out_norm_with[l, h]),
                        "out_norm_without": float(self.out_norm_without[l, h])})
        return out

    def table(self) -> str:
        """The top heads as a fixed-width text table."""
        lines = [f"conditional heads for trigger {self.trigger!r} (tokens {self.trigger_ids})",
                 f"{'layer':>5} {'head':>4} {'score':>6} {'A→trig|with':>12} {'A→0|with':>9} "
                 f"{'A→0|without':>12} {'A→prev|without':>15} {'|o| with':>9} {'|o| without':>12}"]
        for r in self.top:
            lines.append(f"{r['layer']:>5} {r['head']:>4} {r['score']:6.3f} {r['to_trigger_with']:12.3f} "
                         f"{r['to_first_with']:9.3f} {r['to_first_without']:12.3f} {r['to_prev_without']:15.3f} "
                         f"{r['out_norm_with']:9.3f} {r['out_norm_without']:12.3f}")
        return "\n".join(lines)

    def summary(self) -> Dict[str, Any]:
        return to_jsonable({"trigger": self.trigger, "trigger_ids": self.trigger_ids, "meta": self.meta,
                            "top": self.top, "score": self.score, "to_trigger_with": self.to_trigger_with,
                            "to_first_with": self.to_first_with, "to_first_without": self.to_first_without,
                            "to_prev_without": self.to_prev_without})

    def save(self, path: str) -> None:
        save_npz(path, {k: getattr(self, k) for k in ("to_trigger_with", "to_first_with", "to_first_without",
                                                       "to_prev_without", "out_norm_with", "out_norm_without")},
                 {"trigger": self.trigger, "trigger_ids": self.trigger_ids, "n_top": self.n_top,
                  "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "ConditionalHeads":
        a, m = load_npz(path)
        return cls(trigger=m["trigger"], trigger_ids=list(m["trigger_ids"]), n_top=int(m["n_top"]),
                   meta=dict(m["meta"]), **a)


def find_subsequence(ids: np.ndarray, sub: Sequence[int]) -> List[int]:
    """Start positions of every occurrence of ``sub`` in ``ids`` (non-overlapping, left to right)."""
    n, m = len(ids), len(sub)
    out, i = [], 0
    sub = list(int(s) for s in sub)
    while i + m <= n:
        if [int(x) for x in ids[i:i + m]] == sub:
            out.append(i)
            i += m
        else:
            i += 1
    return out


def _conditional_terms(model: Any, tr: Any, kind: str, starts: List[int], n_trig: int, off: int,
                       window: Optional[int], t: Any) -> Dict[str, np.ndarray]:
    """One prompt's (L, H) contributions to :class:`ConditionalHeads` from its trace."""
    onorm = head_output_norms(model, tr.head_out)
    a = np.asarray(tr.attn, dtype=np.float64)
    T = a.shape[-1]
    if kind == "without":
        i = np.arange(2, T)
        return {"to_first_without": a[:, :, 1:, 0].mean(axis=-1),
                "to_prev_without": a[:, :, i, i - 1].mean(axis=-1),
                "out_norm_without": onorm[:, :, 1:].mean(axis=-1)}
    to_trig, to_first, on = [], [], []
    for s0 in starts:
        p0, p1 = s0 + off, s0 + off + n_trig                # trigger occupies [p0, p1)
        q1 = T if window is None else min(T, p1 + int(window))
        if p1 >= q1:
            continue                                        # no query after this occurrence
        to_trig.append(a[:, :, p1:q1, p0:p1].sum(axis=-1))  # (L, H, nq)
        to_first.append(a[:, :, p1:q1, 0])
        on.append(onorm[:, :, p1:q1])
    if not to_trig:
        raise ValueError(f"the trigger is the last token of {t!r}: no query comes after it")
    return {"to_trigger_with": np.concatenate(to_trig, -1).mean(-1),
            "to_first_with": np.concatenate(to_first, -1).mean(-1),
            "out_norm_with": np.concatenate(on, -1).mean(-1)}


def find_conditional_heads(model: Any, with_trigger_text: Union[TextLike, Sequence[TextLike]],
                           without_trigger_text: Union[TextLike, Sequence[TextLike]],
                           trigger: Union[str, int, Sequence[int]] = "'s", top: int = 10,
                           bos: bool = True, window: Optional[int] = None,
                           progress: bool = True, batch_bytes: Optional[int] = None) -> ConditionalHeads:
    """Ranks heads by (attention to the trigger when present) × (attention to position 0 when absent).

    Args:
        model: a :class:`sinklab.Model`.
        with_trigger_text: prompt(s) containing the trigger.
        without_trigger_text: prompt(s) without it (need not be paired with the first list).
        trigger: a string (tokenized on its own, without a leading space: ``"'s"``), a token id,
            or a token-id sequence. Every occurrence in each with-trigger prompt counts; a
            with-trigger prompt without one, or a without-trigger prompt with one, is an error.
        top: how many heads ``ConditionalHeads.top`` lists.
        bos: prepend BOS (position 0 = BOS), else position 0 is the first text token.
        window: only queries within ``window`` tokens after the trigger's last token count
            (default: every later query).
        progress: tqdm bar over prompts.
        batch_bytes: cap in bytes on one forward call's captures; prompts run together, zero-padded
            to the longest with explicit lengths (default :data:`sinklab.batching.BATCH_BYTES`).
            Bitwise the same for any cap.

    Attention to the trigger is summed over the trigger's tokens and averaged over the queries
    after it (over every occurrence), then over prompts; attention to position 0 "without" is
    averaged over queries i >= 1. As a control, ``to_prev_without`` is the attention to the
    previous token in the trigger-free prompts (high for previous-token heads, which look
    "conditional" with ``window=1``).
    """
    if isinstance(trigger, str):
        trig = [int(t) for t in model.tokenize(trigger, bos=False)]
        name = trigger
    elif isinstance(trigger, (int, np.integer)):
        trig, name = [int(trigger)], str(int(trigger))
    else:
        trig = [int(t) for t in trigger]
        name = str(trig)
    if not trig:
        raise ValueError("the trigger has no tokens")
    setting = condition(bos)
    off = 1 if bos else 0
    c = model.config
    acc = {k: [] for k in ("to_trigger_with", "to_first_with", "out_norm_with", "to_first_without",
                           "to_prev_without", "out_norm_without")}
    withs, withouts = _as_list(with_trigger_text), _as_list(without_trigger_text)
    jobs = [("with", t) for t in withs] + [("without", t) for t in withouts]
    seqs, occurrences = [], []
    for kind, t in jobs:                    # check every prompt before running any
        tids = text_ids(model, t)
        starts = find_subsequence(tids, trig)
        if kind == "with" and not starts:
            raise ValueError(f"trigger {name!r} (tokens {trig}) does not occur in the prompt {t!r} "
                             f"(tokens {tids.tolist()})")
        if kind == "without" and starts:
            raise ValueError(f"trigger {name!r} occurs in the trigger-free prompt {t!r}")
        ids = prepare(model, tids, setting)
        if kind == "without" and len(ids) < 3:
            raise ValueError(f"the trigger-free prompt {t!r} needs at least 3 tokens")
        seqs.append(ids)
        occurrences.append(starts)
    per: List[Dict[str, np.ndarray]] = [{} for _ in jobs]   # each prompt's terms, in job order
    for j, tr in run_each(model, seqs, ("attn", "head_out"), batch_bytes=batch_bytes,
                          progress=progress, desc="conditional heads", unit="prompt", ragged=True):
        per[j] = _conditional_terms(model, tr, jobs[j][0], occurrences[j], len(trig), off, window, jobs[j][1])
    for terms in per:                       # appended in job order: the means sum in that order
        for k, v in terms.items():
            acc[k].append(v)
    mean = {k: np.mean(v, axis=0) for k, v in acc.items()}
    meta = {"model": getattr(model, "name", None), "bos_token_id": c.bos_token_id if bos else None,
            "setting": setting, "window": window, "n_with": len(withs), "n_without": len(withouts)}
    return ConditionalHeads(trigger=name, trigger_ids=trig, n_top=int(top), meta=meta, **mean)


# ---------------------------------------------------------------------- status criterion
def noop_log_ratios(res: NoopResult, eps: float = 0.5, kv_rule: str = "majority") -> Dict[str, np.ndarray]:
    """Per prompt, the two quantities of the no-op reading, as natural logs (< 0 supports it):

    ``out_norm``: log(mean ||o_i^h|| / ||v_i|| over sink heads / the same over other heads), queries
    i >= 1; ``first_value``: median over sink kv heads of log(||v_0|| / median_j>=1 ||v_j||).
    Sink heads (sink mass > ``eps``) are chosen once, on all prompts. Each (P,) float64 (NaN where
    a group is empty)."""
    sink = res.sink_mass() > eps
    kv_sink = res.kv_sink_heads(eps, kv_rule)
    out, val = [], []
    for o, r, v in zip(res.out_norm, res.resid_norm, res.kv_value_norm()):
        rel = (o / r[:, None, :])[..., 1:].mean(axis=-1)                       # (L, H)
        out.append(np.log(rel[sink].mean() / rel[~sink].mean()) if sink.any() and (~sink).any() else np.nan)
        if v.shape[-1] > 1 and kv_sink.any():
            val.append(float(np.median(np.log(v[..., 0] / np.median(v[..., 1:], axis=-1))[kv_sink])))
        else:
            val.append(np.nan)
    return {"out_norm": np.asarray(out, np.float64), "first_value": np.asarray(val, np.float64)}


def criterion_noop(res: NoopResult, eps: float = 0.5) -> Dict[str, Any]:
    """The paper's no-op reading (§3.2–3.3) as two verdicts: sink heads write less into the
    residual stream than other heads (``out_norm``), and ⟨bos⟩'s value vector is smaller than
    other tokens' in sink kv heads (``first_value``); each reproduced when the interval over
    prompts of its mean log ratio lies below 0. No sink heads at all: not testable."""
    lr = noop_log_ratios(res, eps)
    out = {}
    for key, what in (("out_norm", "log(sink-head / other-head relative output norm)"),
                      ("first_value", "log(⟨bos⟩ value norm / median token's) in sink kv heads")):
        x = lr[key][np.isfinite(lr[key])]
        if x.size == 0:
            out[key] = S.not_testable(f"no sink heads (mass > {eps:g}) to compare")
            continue
        iv = mean_ci(x)
        out[key] = S.directional(iv, -1, what)
        out[key + "_log_ratio"] = iv
    return out
