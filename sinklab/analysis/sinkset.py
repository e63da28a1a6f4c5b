"""Sink metrics over a prompt set, as Gu et al. (2024) measure them: the sink rate
behind the paper's Fig. 5 and Tables 1–2.

Each prompt is cut to its first T tokens and run once; the first-token importance

    a_0^{(l,h)} = 1/T * sum_{i=0..T-1} A^{(l,h)}_{i,0}

(the mean attention position 0 receives from the T queries that see it) is kept per prompt,
layer and head. The sink rate for a threshold eps is the fraction of (prompt, layer, head)
triples with a_0 > eps; query heads are counted (GQA models included).

What "T tokens" means (*uncertain* in the paper; a parameter here): by default the BOS token is
one of the T (``bos_in_T=True``: [BOS] + the prompt's first T-1 tokens, as when Gu et al. cut
the tokenizer's output, BOS included, to 64 tokens; this is :func:`sinklab.inputs.prepare`'s
rule), so with and without BOS the model sees sequences of the same length T and a_0 averages
over the same number of queries. With ``bos_in_T=False`` the BOS is added on top: [BOS] + the
first T prompt tokens (T+1 in all).

By default the importance comes from the C core's streaming attention statistics
(``capture=("stats",)``, no T x T buffer); ``capture="attn"`` materialises the attention and
applies :func:`sinklab.first_token_importance` instead (same numbers to ~1e-6).

**Where the sink sits** (``keep_keys=True``, for ⟨bos⟩ removal): besides a_0, the mass every
key k receives, m_k = 1/T * sum_i A_{i,k} over all T queries (a query that cannot see k counts
as 0; m_0 = a_0), is kept per (prompt, layer, head). Its argmax is the head's sink position; the
paper predicts that a model trained with a fixed ⟨bos⟩ loses its sinks when the ⟨bos⟩ is
removed, while one trained without it moves them to whatever token comes first.

For a bidirectional encoder every query sees key 0, so a_0 is the mean over all T queries (the
same formula; no query is left out by causality).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..inputs import BOS, LABELS, NOBOS, by_condition, prepare, text_budget, text_ids
from ..batching import run_each
from ..prompts import load_passages
from ..results import load_npz, load_tagged_json, save_npz, save_tagged_json, to_jsonable
from .sinks import check_eps, first_token_importance, sink_rate_of
from ..reprs import compact_repr
from ..labels import concat, long_frame

Prompt = Union[str, Sequence[int], np.ndarray]
FORMAT = "sinklab.SinkStudy/1"


@compact_repr
@dataclass
class SinkStudy:
    """First-token importance of every (prompt, layer, head) and the sink rates derived from it.

    Attributes:
        importance: (P, L, H) float64, a_0 of each prompt, layer and query head (in [0, 1]).
        T: tokens per sequence fed to the model (see ``bos_in_T``).
        bos: whether a BOS token was prepended.
        bos_token_id / bos_token: the BOS id and its text (None without BOS).
        bos_in_T: whether the BOS counts among the T tokens.
        eps: thresholds reported by default (each in (0, 1)).
        model: the model's name; ``source`` describes the prompts.
        first_token_ids: (P,) int64, the token at position 0 of each sequence (the BOS, or each
            prompt's first token without BOS).
        n_skipped: prompts left out as too short (``skip_short=True``).
        capture: ``"stats"`` (streaming C statistics) or ``"attn"`` (full attention).
        key_mass: None, or (P, L, H, T) float64 with ``keep_keys=True``: m_k, the mean
            attention key k receives over all T queries (m_0 = a_0). Not saved by :meth:`save`
            (its summary is, in ``location``).
    """

    importance: np.ndarray
    T: int
    bos: bool
    bos_token_id: Optional[int]
    bos_token: Optional[str]
    eps: Tuple[float, ...]
    model: str
    first_token_ids: np.ndarray
    bos_in_T: bool = True
    n_skipped: int = 0
    source: str = ""
    capture: str = "stats"
    meta: Dict[str, Any] = field(default_factory=dict)
    key_mass: Optional[np.ndarray] = None

    # -------------------------------------------------------------- derived numbers

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per (prompt, layer, head): ``prompt``, ``layer``, ``head``,
        ``a0`` (first-token importance), ``first_token_id`` (the token at position 0) and
        ``model``, ``T``, ``bos``."""
        P = self.importance.shape[0]
        first = np.broadcast_to(np.asarray(self.first_token_ids).reshape(P, 1, 1), self.importance.shape)
        return long_frame({"a0": self.importance, "first_token_id": first}, ("prompt", "layer", "head"),
                          model=self.model, T=self.T, bos=self.bos)

    @property
    def n_prompts(self) -> int:
        """P, the number of prompts measured."""
        return int(self.importance.shape[0])

    @property
    def mean(self) -> np.ndarray:
        """(L, H) float64: a_0 averaged over prompts."""
        return self.importance.mean(axis=0)

    @property
    def std(self) -> np.ndarray:
        """(L, H) float64: standard deviation of a_0 over prompts (population, ddof=0)."""
        return self.importance.std(axis=0)

    def sink_rate(self, eps: float = 0.3) -> float:
        """Fraction in [0, 1] of (prompt, layer, head) triples with a_0 > eps (x100 for %)."""
        return sink_rate_of(self.importance, eps)

    def layer_sink_rate(self, eps: float = 0.3) -> np.ndarray:
        """(L,) float64: per layer, the fraction of (prompt, head) pairs with a_0 > eps."""
        return (self.importance > check_eps(eps)).mean(axis=(0, 2))

    @property
    def sink_rates(self) -> Dict[float, float]:
        """{eps: sink rate} for every eps in ``self.eps``."""
        return {e: self.sink_rate(e) for e in self.eps}

    @property
    def layer_rates(self) -> Dict[float, np.ndarray]:
        """{eps: (L,) per-layer sink rate} for every eps in ``self.eps``."""
        return {e: self.layer_sink_rate(e) for e in self.eps}

    # -------------------------------------------------------------- where the sink sits
    def _need_keys(self) -> np.ndarray:
        if self.key_mass is None:
            raise ValueError("this study kept only a_0; run sink_study(..., keep_keys=True)")
        return self.key_mass

    def sink_position(self) -> np.ndarray:
        """(P, L, H) int64: per (prompt, layer, head), the key with the largest mean attention
        m_k (the first such key on a tie)."""
        return self._need_keys().argmax(axis=-1)

    def location(self, eps: Optional[Sequence[float]] = None) -> Dict[str, Any]:
        """Where the attention mass sits, as fractions of (prompt, layer, head) triples in [0, 1].

        ``at_0`` / ``at_1`` / ``elsewhere``: the largest-mass key is position 0, position 1, or
        another one; ``mean_max_mass``: mean of max_k m_k; ``sink_anywhere[eps]``: fraction with
        max_k m_k > eps (a sink on any token), beside ``sink_rate`` (on position 0 only);
        ``position_counts``: how many triples have their largest-mass key at each position."""
        m = self._need_keys()
        pos = m.argmax(axis=-1)
        top = m.max(axis=-1)
        eps_t = self.eps if eps is None else _check_eps_tuple(eps)
        return {"at_0": float(np.mean(pos == 0)), "at_1": float(np.mean(pos == 1)),
                "elsewhere": float(np.mean(pos > 1)), "mean_max_mass": float(top.mean()),
                "sink_anywhere": {f"{e:g}": float(np.mean(top > e)) for e in eps_t},
                "position_counts": np.bincount(pos.reshape(-1), minlength=m.shape[-1]).tolist()}

    def summary(self) -> Dict[str, Any]:
        """The headline numbers as plain JSON-able values (no per-prompt arrays)."""
        return {"model": self.model, "T": self.T, "bos": self.bos, "bos_token_id": self.bos_token_id,
                "bos_token": self.bos_token, "bos_in_T": self.bos_in_T, "n_prompts": self.n_prompts,
                "n_skipped": self.n_skipped, "source": self.source, "capture": self.capture,
                "sink_rate": {f"{e:g}": r for e, r in self.sink_rates.items()},
                "layer_sink_rate": {f"{e:g}": v.tolist() for e, v in self.layer_rates.items()},
                "mean_first_token_importance": float(self.importance.mean()),
                **({"location": self.location()} if self.key_mass is not None else {})}

    def __str__(self) -> str:
        rates = ", ".join(f"eps={e:g}: {100 * r:.2f}%" for e, r in self.sink_rates.items())
        b = f"BOS {self.bos_token!r} (id {self.bos_token_id})" if self.bos else "no BOS"
        return (f"SinkStudy({self.model}, {self.n_prompts} prompts, T={self.T}, {b}; "
                f"sink rate {rates})")

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> Dict[str, Any]:
        """Everything, as JSON-able values (``importance`` as nested lists)."""
        d = self.summary()
        d.update(format=FORMAT, eps=list(self.eps), importance=self.importance,
                 first_token_ids=self.first_token_ids, meta=self.meta)
        return to_jsonable(d)

    def to_json(self, indent: Optional[int] = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SinkStudy":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved SinkStudy (format {d.get('format')!r}, expected {FORMAT!r})")
        return cls(importance=np.asarray(d["importance"], dtype=np.float64), T=int(d["T"]),
                   bos=bool(d["bos"]), bos_token_id=d["bos_token_id"], bos_token=d["bos_token"],
                   eps=tuple(float(e) for e in d["eps"]), model=d["model"],
                   first_token_ids=np.asarray(d["first_token_ids"], dtype=np.int64),
                   bos_in_T=bool(d["bos_in_T"]), n_skipped=int(d["n_skipped"]),
                   source=d.get("source", ""), capture=d.get("capture", "stats"),
                   meta=d.get("meta", {}))

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes ``path`` through :mod:`sinklab.results`: tagged JSON if it ends in ``.json``,
        otherwise an ``.npz`` (arrays + JSON metadata; no pickle)."""
        path = os.fspath(path)
        d = self.to_dict()
        if path.endswith(".json"):
            save_tagged_json(path, FORMAT, {k: v for k, v in d.items() if k != "format"})
            return
        del d["importance"], d["first_token_ids"]
        save_npz(path, {"importance": self.importance.astype(np.float64),
                        "first_token_ids": self.first_token_ids.astype(np.int64)}, d)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "SinkStudy":
        """Reads what :meth:`save` wrote (``.json`` or ``.npz``)."""
        path = os.fspath(path)
        if path.endswith(".json"):
            return cls.from_dict(load_tagged_json(path, FORMAT))
        arrays, d = load_npz(path)
        d.update(arrays)
        return cls.from_dict(d)


BOS_FORMAT = "sinklab.BosComparison/1"


@compact_repr
@dataclass
class BosComparison:
    """The same prompts measured with (``bos``) and without (``nobos``) a BOS token.

    ``with_bos`` / ``without_bos`` are read-only aliases of the two fields."""

    bos: SinkStudy
    nobos: SinkStudy


    def to_frame(self) -> Any:
        """Both studies' :meth:`SinkStudy.to_frame` one under the other, with a first column
        ``condition`` (``"bos"`` or ``"nobos"``)."""
        return concat({BOS: self.bos.to_frame(), NOBOS: self.nobos.to_frame()}, "condition")

    @property
    def with_bos(self) -> SinkStudy:
        return self.bos

    @property
    def without_bos(self) -> SinkStudy:
        return self.nobos

    def summary(self) -> Dict[str, Any]:
        return {BOS: self.bos.summary(), NOBOS: self.nobos.summary()}

    def table(self) -> str:
        """A small Markdown table of the sink rates (%), with and without BOS."""
        eps = sorted(set(self.bos.eps) | set(self.nobos.eps))
        head = "| | " + " | ".join(f"sink rate eps={e:g}" for e in eps) + " | mean a_0 |"
        rows = [head, "|---" * (len(eps) + 2) + "|"]
        for key, s in ((BOS, self.bos), (NOBOS, self.nobos)):
            rows.append(f"| {LABELS[key]} | " + " | ".join(f"{100 * s.sink_rate(e):.2f}%" for e in eps)
                        + f" | {s.importance.mean():.3f} |")
        return "\n".join(rows)

    def to_json(self) -> str:
        return json.dumps({"format": BOS_FORMAT, **self._payload()})

    def _payload(self) -> Dict[str, Any]:
        return {BOS: self.bos.to_dict(), NOBOS: self.nobos.to_dict()}

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes both studies to one tagged JSON file."""
        save_tagged_json(path, BOS_FORMAT, self._payload())

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "BosComparison":
        """Reads what :meth:`save` wrote (files with the older keys ``with_bos``/``without_bos`` too)."""
        d = by_condition(load_tagged_json(path, BOS_FORMAT))
        return cls(SinkStudy.from_dict(d[BOS]), SinkStudy.from_dict(d[NOBOS]))


# ------------------------------------------------------------------ helpers
def _check_T(model, T: int, extra: int) -> int:
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)):
        raise TypeError(f"T must be an integer, got {T!r}")
    T = int(T)
    if T < 2:
        raise ValueError(f"T must be at least 2 tokens, got {T}")
    ctx = model.config.context_length
    if T + extra > ctx:
        raise ValueError(f"T={T}{' plus the BOS' if extra else ''} exceeds the model's context "
                         f"length {ctx}")
    return T


def _check_eps_tuple(eps: Union[float, Sequence[float]]) -> Tuple[float, ...]:
    seq = (eps,) if np.isscalar(eps) else tuple(eps)
    if not seq:
        raise ValueError("eps: give at least one threshold")
    return tuple(check_eps(e) for e in seq)


def _describe(p: Prompt) -> str:
    if isinstance(p, str):
        s = " ".join(p.split())
        return repr(s[:50] + ("..." if len(s) > 50 else ""))
    return f"token ids {list(np.asarray(p).reshape(-1)[:6])}..."


def _token_lists(model, prompts: Sequence[Prompt]) -> List[np.ndarray]:
    out = []
    for p in prompts:
        try:
            out.append(text_ids(model, p))
        except TypeError:
            raise TypeError(f"a prompt must be a str or a 1-D integer array of token ids, got {_describe(p)}") from None
    return out


def _select(prompts: Sequence[Prompt], tokens: List[np.ndarray], need: int, T: int,
            skip_short: bool) -> Tuple[List[int], int]:
    """Indices of the prompts with at least ``need`` tokens; ValueError for the first short
    one unless ``skip_short``."""
    keep = []
    for i, ids in enumerate(tokens):
        if len(ids) >= need:
            keep.append(i)
        elif not skip_short:
            raise ValueError(f"prompt {i} ({_describe(prompts[i])}) has {len(ids)} tokens, fewer than "
                             f"the {need} needed for T={T}; shorten T, drop it, or pass skip_short=True")
    if not keep:
        longest = max((len(t) for t in tokens), default=0)
        raise ValueError(f"no prompt has the {need} tokens needed for T={T}"
                         f"{' after the BOS' if need < T else ''}: the longest of the {len(tokens)} "
                         f"has {longest}; lower T or give longer prompts")
    return keep, len(tokens) - len(keep)


def _default_prompts(prompts: Optional[Sequence[Prompt]]) -> Tuple[Sequence[Prompt], str]:
    if prompts is None:
        return load_passages("sinks"), "sinklab passages, split 'sinks'"
    if isinstance(prompts, (str, bytes)):
        raise TypeError("prompts must be a list of prompts, not a single string")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty")
    return prompts, f"{len(prompts)} user prompts"


# the prompt handling other prompt-set analyses share (analysis.massive, analysis.key_geometry)
check_T, default_prompts, select_prompts, token_lists = _check_T, _default_prompts, _select, _token_lists


def key_mass_from_importance(importance: np.ndarray, bidirectional: bool) -> np.ndarray:
    """m_k = 1/T sum_i A_{i,k} (float64, same shape) from Gu et al.'s per-key a_k = mean over the
    T - k queries i >= k (causal: a_k (T - k) / T; bidirectional: every query sees k, m_k = a_k)."""
    imp = np.asarray(importance, np.float64)
    if bidirectional:
        return imp.copy()
    T = imp.shape[-1]
    return imp * (T - np.arange(T)) / T


def measure_first_importance(model, seqs: np.ndarray, capture: str = "stats", progress: bool = False,
                             desc: str = "first-token importance", batch_bytes: Optional[int] = None,
                             keep_keys: bool = False,
                             intervene: Any = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Gu et al.'s a_0 of every row of ``seqs`` (P, T) token ids, as the sink study measures it.

    The rows run in batches under ``batch_bytes`` (:func:`sinklab.batching.run_each`; the same
    bits as one run per row), with ``capture`` ``"stats"`` (streaming C statistics) or
    ``"attn"`` (full attention); ``intervene`` applies to every run; ``progress``/``desc`` the bar.

    Returns:
        ((P, L, H) float64 a_0, and with ``keep_keys`` the (P, L, H, T) float64 key masses m_k,
        else None).
    """
    c = model.config
    P, T = len(seqs), seqs.shape[1]
    out = np.empty((P, c.n_layers, c.n_heads), np.float64)
    keys = np.empty((P, c.n_layers, c.n_heads, T), np.float64) if keep_keys else None
    for p, tr in run_each(model, seqs, (capture,), intervene=intervene, batch_bytes=batch_bytes,
                          progress=progress, desc=desc, unit="prompt"):
        if capture == "stats":
            out[p] = tr.stats.importance[..., 0]
            if keep_keys:
                keys[p] = key_mass_from_importance(tr.stats.importance, c.bidirectional)
        else:
            out[p] = first_token_importance(tr.attn)
            if keep_keys:
                keys[p] = tr.attn.astype(np.float64).sum(axis=-2) / T
    return out, keys


# ------------------------------------------------------------------ public API
def sink_study(model, prompts: Optional[Sequence[Prompt]] = None, T: int = 64,
               eps: Union[float, Sequence[float]] = (0.3, 0.8), bos: bool = True,
               skip_short: bool = False, bos_in_T: bool = True, capture: str = "stats",
               progress: bool = True, batch_bytes: Optional[int] = None,
               keep_keys: bool = False, intervene: Any = None) -> SinkStudy:
    """First-token importance and sink rates of ``model`` over a prompt set (Gu et al.'s metric).

    Args:
        model: a :class:`sinklab.Model`.
        prompts: strings (tokenized without BOS) or 1-D arrays of token ids (without BOS);
            default: the shipped passages, split ``"sinks"`` (144 passages).
        T: tokens per sequence (default 64, as Gu et al.); every prompt is cut to its first
            T tokens (T - 1 after a BOS when ``bos_in_T``).
        eps: threshold(s) in (0, 1) reported by the result (any other eps can be asked later).
        bos: prepend the model's BOS token.
        skip_short: leave out prompts with too few tokens (counted in ``n_skipped``) instead of
            raising a ValueError that names the first one.
        bos_in_T: the BOS counts among the T tokens (default) or comes on top of them.
        capture: ``"stats"`` (streaming C statistics, default) or ``"attn"`` (full attention).
        progress: show a tqdm bar over prompts.
        batch_bytes: cap in bytes on the capture buffers of one forward call; the prompts (all
            of one length) run as batches of as many as fit (default
            :data:`sinklab.batching.BATCH_BYTES`, 256 MiB: 57 prompts a call with
            ``capture="attn"`` on SmolLM2-135M at T = 64). Results are bitwise the same for any cap.
        keep_keys: also keep every key's mass m_k, (P, L, H, T) float64, for
            :meth:`SinkStudy.sink_position` and :meth:`SinkStudy.location` (where the sink sits).
        intervene: an optional :class:`sinklab.Intervention` applied in every forward (e.g.
            ``mask_first`` on layers 0-2: where the later layers' sinks go); recorded in
            ``meta["intervention"]``.

    Returns:
        A :class:`SinkStudy` with ``importance`` (P, L, H) float64.
    """
    eps_t = _check_eps_tuple(eps)
    if capture not in ("stats", "attn"):
        raise ValueError(f"capture must be 'stats' or 'attn', got {capture!r}")
    bos_id = model.bos_id(bos)
    extra = 1 if (bos and not bos_in_T) else 0
    T = _check_T(model, T, extra)
    prompts, source = _default_prompts(prompts)
    tokens = _token_lists(model, prompts)
    n_seq = T + extra                      # prepare()'s budget: the BOS counts among it
    need = text_budget(n_seq, bos)
    keep, skipped = _select(prompts, tokens, need, T, skip_short)
    seqs = np.stack([prepare(model, tokens[i], bos, n_seq) for i in keep])
    imp, keys = measure_first_importance(model, seqs, capture, progress, f"sink study ({'BOS' if bos else 'no BOS'}, T={T})",
                         batch_bytes, keep_keys, intervene)
    return SinkStudy(importance=imp, T=T, bos=bool(bos), bos_token_id=bos_id,
                     bos_token=None if bos_id is None else model.detokenize([bos_id]),
                     eps=eps_t, model=model.name, first_token_ids=seqs[:, 0].copy(),
                     bos_in_T=bool(bos_in_T), n_skipped=skipped, source=source, capture=capture,
                     meta={"seq_len": int(seqs.shape[1]), "kept_prompts": keep,
                           "n_layers": model.config.n_layers, "n_heads": model.config.n_heads,
                           "bidirectional": bool(model.config.bidirectional),
                           **({"intervention": repr(intervene)} if intervene is not None else {})},
                     key_mass=keys)


def compare_bos(model, prompts: Optional[Sequence[Prompt]] = None, T: int = 64,
                eps: Union[float, Sequence[float]] = (0.3, 0.8), skip_short: bool = False,
                bos_in_T: bool = True, capture: str = "stats", progress: bool = True,
                batch_bytes: Optional[int] = None, keep_keys: bool = False,
                intervene: Any = None) -> BosComparison:
    """:func:`sink_study` of the same prompts with and without the BOS token.

    Both runs use exactly the same prompts: with ``skip_short`` a prompt is kept only if it is
    long enough for both (T tokens without BOS). Without BOS position 0 is each prompt's own
    first token. Arguments as for :func:`sink_study` (each condition runs in batches under
    ``batch_bytes``; ``keep_keys`` keeps where each head's mass sits, in both; ``intervene``
    applies to both).
    """
    eps_t = _check_eps_tuple(eps)
    model.bos_id(True)
    T = _check_T(model, T, 0 if bos_in_T else 1)
    prompts, source = _default_prompts(prompts)
    tokens = _token_lists(model, prompts)
    keep, skipped = _select(prompts, tokens, T, T, skip_short)
    chosen = [tokens[i] for i in keep]
    kw = dict(T=T, eps=eps_t, bos_in_T=bos_in_T, capture=capture, progress=progress,
              batch_bytes=batch_bytes, keep_keys=keep_keys, intervene=intervene)
    with_b = sink_study(model, chosen, bos=True, **kw)
    without = sink_study(model, chosen, bos=False, **kw)
    for s in (with_b, without):
        s.n_skipped, s.source = skipped, source
        s.meta["kept_prompts"] = keep
    return BosComparison(bos=with_b, nobos=without)
