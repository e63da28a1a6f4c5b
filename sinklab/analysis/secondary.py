"""Secondary sinks, beyond the paper: which keys *other than position 0* attract attention mass,
which kinds of token they are (newline, punctuation, delimiters, ...), and which keys each head
favours, at contexts up to the model's length (T = 8192 and more), in O(T) memory.

Question answered: is the first token the only sink, or do newlines, full stops and other
delimiters collect attention too (Gu et al. 2024 and Sun et al. 2024 report such tokens), and
how much more than their frequency and their position would give them?

Inputs are the ``stats`` capture of :meth:`sinklab.Model.run`: the C kernel's streamed
importance (csrc/attention.h), which for query head h of layer l and key k is

    imp_k = (1 / (T - k)) * sum_{i >= k} A[i, k]        (queries that cannot see k count as 0)

so no T x T matrix is ever formed. Definitions here, per (layer, head), 0-based positions:

- n_k, the number of queries that see key k: T - k causally; min(T - k, w) under a sliding
  window of w keys (query i sees i - w < j <= i); T when bidirectional (:func:`visible_queries`).
- the column mass m_k = sum_i A[i, k] = imp_k (T - k) (attention mass key k receives, in units of
  one query's row; sum_k m_k = T).
- Gu et al.'s importance over the queries that see k, a_k = m_k / n_k (:func:`column_mean`). With
  no window it is exactly the C statistic; under a window the C statistic averages over all
  T - k later queries, so a_k is converted here, exactly, in float64 (the C statistic is left as
  it is: other analyses and saved results rely on its definition).
- the uniform baseline u_k: the column mass under uniform attention over each query's visible
  keys (:func:`uniform_mass`); it carries the positional advantage of early keys (seen by more
  queries) and nothing else.

Token classes (:data:`TOKEN_CLASSES`, :func:`token_class`) come from the tokenizer's decoded string
of each key token: ``first`` (position 0, or the ⟨bos⟩ id anywhere), ``newline`` (contains a line
break), ``whitespace`` (only blanks), ``delimiter`` (only brackets, quotes, dashes, slashes,
bars), ``punctuation`` (only other punctuation, e.g. ``.`` ``,`` ``;`` ``:`` ``!`` ``?``), ``other``.

Per prompt and (layer, head), over the secondary keys k >= 1: the mass share of class c,
S_c = sum_{k in c} m_k / sum_{k>=1} m_k; its frequency F_c (share of the keys); its uniform share
U_c (the same with u_k). Enrichment over frequency S_c / F_c and over position S_c / U_c (1: the
class gets what uniform attention would give it). Top keys per head: the keys k in
[1, T - min_queries] (each a_k a mean over >= min_queries queries) with the largest a_k.
Intervals are bootstraps over prompts (:mod:`sinklab.analysis.stats`).
"""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..batching import run_each
from ..inputs import prepare
from ..results import load_npz, save_npz, to_jsonable
from ..reprs import compact_repr
from .long_context import long_texts
from .stats import Interval, mean_ci

FORMAT = "sinklab.SecondarySinks/1"
TOKEN_CLASSES = ("first", "newline", "punctuation", "delimiter", "whitespace", "other")
FIRST, NEWLINE, PUNCTUATION, DELIMITER, WHITESPACE, OTHER = range(len(TOKEN_CLASSES))
DELIMITERS = frozenset("()[]{}<>\"'`“”‘’«»‹›-‐‑‒–—―/\\|")
FIELDS = ("class_share", "class_freq", "class_uniform", "first_share", "a_max2", "top_keys", "top_a",
          "top_class", "ids", "classes")


def token_class(piece: str, first: bool = False) -> int:
    """The class index (into :data:`TOKEN_CLASSES`) of one token from its decoded string;
    ``first`` marks position 0 or a ⟨bos⟩ token."""
    if first:
        return FIRST
    if "\n" in piece or "\r" in piece:
        return NEWLINE
    s = piece.strip()
    if not s:
        return WHITESPACE if piece else OTHER
    if all(ch in DELIMITERS for ch in s):
        return DELIMITER
    if all(unicodedata.category(ch).startswith("P") or ch in DELIMITERS for ch in s):
        return PUNCTUATION
    return OTHER


def token_classes(model: Any, ids: np.ndarray, bos_id: Optional[int] = None,
                  cache: Optional[Dict[int, int]] = None) -> np.ndarray:
    """(T,) int8 class of every token of ``ids`` (position 0 and every ``bos_id`` token are
    ``first``), from ``model.tokenizer``'s decoding of each id alone."""
    cache = {} if cache is None else cache
    out = np.empty(len(ids), np.int8)
    for t, i in enumerate(np.asarray(ids).tolist()):
        if t == 0 or (bos_id is not None and i == bos_id):
            out[t] = FIRST
            continue
        if i not in cache:
            cache[i] = token_class(model.tokenizer.decode([i]))
        out[t] = cache[i]
    return out


def visible_queries(T: int, window: int = 0, bidirectional: bool = False, key_start: Optional[np.ndarray] = None,
                    keep_first: bool = False) -> np.ndarray:
    """(T,) float64: n_k, how many queries see key k (causal T - k; min(T - k, window) with a
    sliding window of ``window`` keys; T when bidirectional). With ``key_start`` (T,) (the
    packing mask of :meth:`sinklab.Model.run`: query i sees keys >= key_start[i], nondecreasing)
    only the queries of k's own document count, and with ``keep_first`` every query sees key 0
    (also outside a window, as csrc/attention.c keeps it)."""
    T = int(T)
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if bidirectional:
        return np.full(T, float(T))
    k = np.arange(T)
    end = np.full(T, T) if not window or window <= 0 else np.minimum(k + int(window), T)  # one past the last query
    if key_start is not None:
        ks = np.asarray(key_start, np.int64).reshape(-1)
        if ks.shape != (T,) or np.any(np.diff(ks) < 0) or np.any(ks > k) or np.any(ks < 0):
            raise ValueError(f"key_start must be {T} nondecreasing integers with 0 <= key_start[i] <= i")
        own = np.searchsorted(ks, k, side="right")               # queries i < own[k] have key_start[i] <= k
        end = np.minimum(end, own)
        if keep_first:                  # the C kernel keeps key 0 visible to every query, window or not
            end[0] = T
    return (end - k).astype(np.float64)


def column_mass(importance: np.ndarray) -> np.ndarray:
    """(..., T) float64 m_k = sum_i A[i, k] from the C importance (..., T) of a causal model
    (imp_k (T - k), exact whatever the window: the C statistic sums every query that sees k)."""
    imp = np.asarray(importance, np.float64)
    T = imp.shape[-1]
    return imp * (T - np.arange(T, dtype=np.float64))


def column_mean(importance: np.ndarray, window: int = 0, key_start: Optional[np.ndarray] = None,
                keep_first: bool = False) -> np.ndarray:
    """(..., T) float64 Gu et al.'s a_k over the queries that see key k, from the C importance
    of one causal layer with sliding window ``window`` (0: none; then a_k == importance) and the
    run's ``key_start`` / ``keep_first`` (the C statistic counts the queries outside k's
    document as 0 too, dividing by T - k)."""
    imp = np.asarray(importance, np.float64)
    T = imp.shape[-1]
    return column_mass(imp) / visible_queries(T, window, key_start=key_start, keep_first=keep_first)


def uniform_mass(T: int, window: int = 0) -> np.ndarray:
    """(T,) float64 column mass under uniform causal attention: query i gives 1 / c_i to each
    of its c_i = min(i + 1, window or i + 1) keys; u_k = sum of 1 / c_i over the queries that see k."""
    T = int(T)
    i = np.arange(T, dtype=np.float64)
    c = np.minimum(i + 1, float(window)) if window and window > 0 else i + 1
    cum = np.concatenate([[0.0], np.cumsum(1.0 / c)])
    last = np.minimum(np.arange(T) + (window if window and window > 0 else T), T)  # one past the last query
    return cum[last] - cum[np.arange(T)]


def class_shares(mass: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """(..., C) share of the secondary mass (keys k >= 1) per class, from mass (..., T) and
    classes (T,); a class with no key gets 0."""
    m = np.asarray(mass, np.float64)[..., 1:]
    onehot = (np.asarray(classes)[1:, None] == np.arange(len(TOKEN_CLASSES))[None, :]).astype(np.float64)
    tot = m.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (m @ onehot) / tot


def top_keys(a: np.ndarray, n: int, min_queries: int) -> np.ndarray:
    """(..., n) int64: per head, the n keys k in [1, T - min_queries] with the largest a_k (..., T),
    largest first (ties: the earlier key)."""
    T = a.shape[-1]
    hi = max(2, T - int(min_queries) + 1)
    sub = a[..., 1:hi]
    n = min(int(n), sub.shape[-1])
    order = np.argsort(-sub, axis=-1, kind="stable")[..., :n]
    return order + 1


@compact_repr
@dataclass
class SecondarySinks:
    """Secondary sinks of P prompts of T tokens (definitions in
    :mod:`sinklab.analysis.secondary`'s docstring; C = len(TOKEN_CLASSES)).

    Attributes:
        class_share: (P, L, H, C) share of the secondary mass (keys >= 1) per class.
        class_freq: (P, C) share of the secondary keys per class.
        class_uniform: (P, L, C) share under uniform attention (depends on the layer's window).
        first_share: (P, L, H) m_0 / T, the share of all attention mass on position 0.
        a_max2: (P, L, H) the largest a_k over k in [1, T - min_queries].
        top_keys: (P, L, H, n_top) int64 positions of each head's top secondary keys.
        top_a: (P, L, H, n_top) their a_k. top_class: (P, L, H, n_top) int8 their classes.
        ids: (P, T) int64 the sequences run. classes: (P, T) int8 the class of every key.
        T, bos, model, min_queries, windows (one per layer, 0 = full), pieces (id -> decoded
        string of every id among the top keys), source, meta.
    """

    class_share: np.ndarray
    class_freq: np.ndarray
    class_uniform: np.ndarray
    first_share: np.ndarray
    a_max2: np.ndarray
    top_keys: np.ndarray
    top_a: np.ndarray
    top_class: np.ndarray
    ids: np.ndarray
    classes: np.ndarray
    T: int
    bos: bool
    model: str
    min_queries: int
    windows: List[int] = field(default_factory=list)
    pieces: Dict[int, str] = field(default_factory=dict)
    source: str = ""
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return int(self.ids.shape[0])

    def enrichment(self, over: str = "frequency") -> np.ndarray:
        """(P, C): per prompt, the head-mean class share over its frequency (``over="frequency"``)
        or over its uniform-attention share (``"position"``); NaN where the class is absent."""
        share = self.class_share.mean(axis=(1, 2))
        if over not in ("frequency", "position"):
            raise ValueError(f"over must be 'frequency' or 'position', got {over!r}")
        den = self.class_freq if over == "frequency" else self.class_uniform.mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, share / den, np.nan)

    def secondary_sink_rate(self, eps: float = 0.3) -> Interval:
        """Interval over prompts of the fraction of (layer, head) whose largest secondary a_k
        exceeds ``eps``."""
        return mean_ci((self.a_max2 > eps).astype(np.float64))

    def top_class_share(self) -> np.ndarray:
        """(P, C): per prompt, the fraction of heads whose top secondary key is of class c."""
        t = self.top_class[..., 0]
        return np.stack([(t == c).mean(axis=(1, 2)) for c in range(len(TOKEN_CLASSES))], axis=1)

    def head_top(self, layer: int, head: int, prompt: int = 0) -> List[Dict[str, Any]]:
        """One head's top secondary keys in one prompt: position, token string, class, a_k."""
        L, H = self.a_max2.shape[1:]
        for name, v, n in (("layer", layer, L), ("head", head, H), ("prompt", prompt, self.n_prompts)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
                raise ValueError(f"{name} must be an integer in [0, {n}), got {v!r}")
        out = []
        for j, k in enumerate(self.top_keys[prompt, layer, head].tolist()):
            i = int(self.ids[prompt, k])
            out.append({"pos": int(k), "id": i, "token": self.pieces.get(i, ""),
                        "class": TOKEN_CLASSES[int(self.top_class[prompt, layer, head, j])],
                        "a": float(self.top_a[prompt, layer, head, j])})
        return out

    def class_summary(self) -> Dict[str, Dict[str, Any]]:
        """Per class: frequency, mass share, enrichment over frequency and over position, share
        of heads whose top key is of that class, each an interval over prompts (dict)."""
        share = self.class_share.mean(axis=(1, 2))
        ef, ep, top = self.enrichment("frequency"), self.enrichment("position"), self.top_class_share()
        return {name: {"freq": mean_ci(self.class_freq[:, c]).to_dict(), "share": mean_ci(share[:, c]).to_dict(),
                       "enrich_freq": mean_ci(ef[:, c]).to_dict(), "enrich_pos": mean_ci(ep[:, c]).to_dict(),
                       "top_heads": mean_ci(top[:, c]).to_dict()}
                for c, name in enumerate(TOKEN_CLASSES) if c != FIRST}

    def summary(self) -> Dict[str, Any]:
        return to_jsonable({"model": self.model, "T": self.T, "bos": self.bos, "n_prompts": self.n_prompts,
                            "first_share": mean_ci(self.first_share).to_dict(),
                            "secondary_sink_rate": self.secondary_sink_rate().to_dict(),
                            "classes": self.class_summary()})

    def __str__(self) -> str:
        e = self.enrichment("position")
        ef = np.array([np.nan if np.isnan(col).all() else np.nanmean(col) for col in e.T])
        parts = ", ".join(f"{TOKEN_CLASSES[c]} x{ef[c]:.2f}" for c in range(1, len(TOKEN_CLASSES))
                          if np.isfinite(ef[c]))
        return (f"SecondarySinks({self.model}, {self.n_prompts} prompts, T={self.T}: position 0 takes "
                f"{self.first_share.mean():.1%} of the mass; enrichment over position: {parts})")

    # ------------------------------------------------------------------ persistence
    def _meta(self) -> Dict[str, Any]:
        return {"format": FORMAT, "T": self.T, "bos": self.bos, "model": self.model, "min_queries": self.min_queries,
                "windows": list(self.windows), "pieces": {str(k): v for k, v in self.pieces.items()},
                "source": self.source, "meta": self.meta}

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Writes an ``.npz`` (arrays + JSON metadata, no pickle); returns the file written."""
        return save_npz(path, {f: getattr(self, f) for f in FIELDS}, self._meta())

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "SecondarySinks":
        arrays, d = load_npz(path)
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved SecondarySinks (format {d.get('format')!r}, expected {FORMAT!r})")
        return cls(**{f: arrays[f] for f in FIELDS}, T=int(d["T"]), bos=bool(d["bos"]), model=str(d["model"]),
                   min_queries=int(d["min_queries"]), windows=[int(w) for w in d["windows"]],
                   pieces={int(k): v for k, v in d["pieces"].items()}, source=d.get("source", ""),
                   meta=d.get("meta", {}))


def default_bos(model: Any) -> bool:
    """The model's own ⟨bos⟩ rule: its tokenizer's ``add_bos_default`` (Gemma: True; SmolLM2,
    Qwen2.5: False), True when the tokenizer does not say."""
    return bool(getattr(model.tokenizer, "add_bos_default", True))


def long_sequences(model: Any, T: int, n: int, bos: bool) -> np.ndarray:
    """(n, T) int64: ``n`` stretches of the shipped passages joined by blank lines
    (:func:`sinklab.analysis.long_context.long_texts`), each starting at another passage, with
    the model's ⟨bos⟩ in front when ``bos`` (counted among the T)."""
    texts = long_texts(model, T, n)
    short = min(len(x) for x in texts)
    if short < T:
        raise ValueError(f"the shipped passages give {short} tokens of {model.name}'s tokenizer, fewer than T={T}")
    return np.stack([prepare(model, x, bos, T) for x in texts])


def secondary_of(importance: np.ndarray, classes: np.ndarray, windows: Sequence[int], n_top: int,
                 min_queries: int) -> Dict[str, np.ndarray]:
    """Every per-prompt quantity of :class:`SecondarySinks` for one sequence, from its C
    importance (L, H, T), the classes (T,) of its keys and each layer's window."""
    imp = np.asarray(importance, np.float64)
    L, H, T = imp.shape
    mass = column_mass(imp)
    a = np.stack([column_mean(imp[l], windows[l]) for l in range(L)])
    uni = np.stack([uniform_mass(T, windows[l]) for l in range(L)])
    onehot = (classes[1:, None] == np.arange(len(TOKEN_CLASSES))[None, :])
    top = top_keys(a, n_top, min_queries)
    return {"class_share": class_shares(mass, classes), "class_freq": onehot.mean(axis=0),
            "class_uniform": class_shares(uni, classes), "first_share": mass[..., 0] / T,
            "a_max2": np.take_along_axis(a, top[..., :1], -1)[..., 0], "top_keys": top,
            "top_a": np.take_along_axis(a, top, -1), "top_class": classes[top]}


def secondary_sinks(model: Any, T: int = 512, n_prompts: int = 4, bos: Optional[bool] = None,
                    seqs: Optional[np.ndarray] = None, n_top: int = 5, min_queries: int = 16,
                    progress: bool = True, batch_bytes: Optional[int] = None) -> SecondarySinks:
    """Secondary sinks of ``model``: per (prompt, layer, head), the attention mass on each kind
    of key token beyond position 0, and each head's top keys (definitions in the module
    docstring), streamed from the C kernel in O(T) memory.

    Args:
        model: a causal :class:`sinklab.Model` (sliding windows are handled per layer).
        T: tokens per sequence (the ⟨bos⟩ included), up to the context length (8192 and more).
        n_prompts: sequences (stretches of the shipped passages joined by blank lines, each
            starting at another passage: the units of every interval).
        bos: put the model's ⟨bos⟩ at position 0; None: the model's own rule
            (:func:`default_bos`).
        seqs: (P, T) token ids to run instead (the ⟨bos⟩, if any, already in place).
        n_top: top keys kept per head. min_queries: a top key is seen by at least this many
            queries (keys k <= T - min_queries).
        progress: a tqdm bar over prompts. batch_bytes: the forward's memory cap per call.

    Returns:
        A :class:`SecondarySinks`.

    Raises:
        ValueError: a bidirectional model, T < min_queries + 2, or bad sequences.
    """
    c = model.config
    if c.bidirectional:
        raise ValueError(f"{model.name} is bidirectional: secondary sinks are defined here for causal models")
    bos = default_bos(model) if bos is None else bool(bos)
    if seqs is None:
        if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or T < int(min_queries) + 2:
            raise ValueError(f"T must be an integer >= min_queries + 2 = {int(min_queries) + 2}, got {T!r}")
        if isinstance(n_prompts, bool) or not isinstance(n_prompts, (int, np.integer)) or n_prompts < 1:
            raise ValueError(f"n_prompts must be a positive integer, got {n_prompts!r}")
        seqs, source = long_sequences(model, int(T), int(n_prompts), bos), "shipped passages joined by blank lines"
    else:
        seqs, source = np.asarray(seqs), "given token ids"
        if seqs.ndim != 2 or not np.issubdtype(seqs.dtype, np.integer) or seqs.shape[1] < int(min_queries) + 2:
            raise ValueError(f"seqs must be (P, T) integer token ids with T >= {int(min_queries) + 2}, got "
                             f"{seqs.shape} {seqs.dtype}")
        seqs = seqs.astype(np.int64)
    P, T = seqs.shape
    windows = [c.layer_window(l) for l in range(c.n_layers)]
    bos_id = c.bos_token_id if bos else None
    cache: Dict[int, int] = {}
    classes = np.stack([token_classes(model, s, bos_id, cache) for s in seqs])
    per: Dict[str, List[Any]] = {k: [None] * P for k in FIELDS[:8]}
    for p, tr in run_each(model, seqs, ("stats",), logits_from=-1, batch_bytes=batch_bytes, progress=progress,
                          desc=f"secondary sinks (T={T})", unit="prompt"):
        for k, v in secondary_of(tr.stats.importance, classes[p], windows, n_top, min_queries).items():
            per[k][p] = v
    arrays = {k: np.stack(v) for k, v in per.items()}
    used = np.unique(seqs[np.arange(P)[:, None, None, None], arrays["top_keys"]])
    pieces = {int(i): model.tokenizer.decode([int(i)]) for i in used.tolist()}
    return SecondarySinks(**arrays, ids=seqs, classes=classes, T=int(T), bos=bos, model=model.name,
                          min_queries=int(min_queries), windows=windows, pieces=pieces, source=source,
                          meta={"bos_token_id": c.bos_token_id,
                                "tokenizer_adds_bos": getattr(model.tokenizer, "add_bos_default", None),
                                "a_k": "over the queries that see k (window-converted from the C importance)"})
