"""Over-mixing metrics: rank collapse and representational collapse (the paper's §3, Prop. 3.1).

Rank-collapse residual of the token matrix V (T×d) at each layer, with mu the mean over tokens:

    r^(l) = || V^(l) - 1 mu^T ||_F / || V^(l) ||_F        (0: every token identical)

Representational collapse (Barbero et al. 2024): the distance between the last-token
representation of a sequence and that of the same sequence with its last token repeated,

    D^(l) = || v_T^(l) - v'_{T+1}^(l) ||_2               (small: the model cannot tell them apart)

``v^(l)`` is the residual stream entering layer l (``Trace.resid``; l = 0 embeddings, l = L the
last layer's output before the final norm). Because attention is causal, the representation of
the original last token is read from the same forward pass as the repeated one (position T-1 of
the sequence with the repeat appended), so each D costs one forward pass.

:func:`collapse_vs_length` sweeps T (the first T text tokens of a passage), with and without
BOS. With BOS, the sequence is BOS + T text tokens. Which rows enter V for the rank-collapse
residual is a parameter (the sink row often has a norm far above the others and then dominates
both ||V - 1 mu^T||_F and ||V||_F):

- ``"text_after_first"`` (default): text tokens 1..T-1 — the same tokens in both settings and
  never position 0, so no sink row in either setting (on SmolLM2 the position-0 row has a norm
  far above the rest with or without BOS and pushes the residual to ~0.99 in middle layers);
- ``"text"``: the T text tokens — without BOS this includes the first text token, which is then
  usually the sink, so the two settings are not comparable;
- ``"all"``: every position of the run (BOS included).

Prop. 3.1 (rank collapse implies representational collapse): with mu the mean row of V,
if ||V - 1 mu^T||_F < Δ/2 then ||v_T - v_{T-1}||_2 < Δ, for the last two tokens v_T, v_{T-1}
of the *same* sequence (rows of V). Taking the tightest Δ (any Δ > 2||V - 1 mu^T||_F), the
implication is equivalent to

    ||v_T - v_{T-1}||_2 <= 2 ||V - 1 mu^T||_F .

:func:`prop31_check` returns both sides in absolute residual-stream units, the boolean per
layer, and the slack ||v_T - v_{T-1}|| / (2 ||V - 1 mu^T||_F) (<= 1 when it holds). Because
v_T and v_{T-1} are rows of V, the triangle inequality gives ||v_T - v_{T-1}|| <=
||v_T - mu|| + ||v_{T-1} - mu|| <= sqrt(2) ||V - 1 mu^T||_F, so the slack can never exceed
1/sqrt(2) ≈ 0.707: a violation means the numbers are wrong, not that the proposition failed.
The slack says how much of the bound is used: near 0.707 the deviation from the mean sits in
the last two tokens; near 0, rank collapse would have to go much further before it forced the
last two tokens together. (This check compares tokens within one sequence; ``repr_dist``
compares the last token of two sequences, which Prop. 3.1 does not cover.)

One passage is an anecdote: :func:`collapse_trend` measures both metrics per (passage unit, T,
layer) over independent units (:func:`passage_units`: disjoint passages, concatenated when one
is shorter than the longest T) and fits the trends the paper's claim is about (the slope over
depth and over log T, per unit, with bootstrap intervals over units);
:func:`criterion_collapse` turns them into a verdict, :func:`criterion_prop31` reports
Prop. 3.1 as the consistency check it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..inputs import BOS, BosArg, check_length, condition, conditions, prepare, text_ids
from ..progress import progress_bar
from ..prompts import load_passages
from ..results import load_npz, save_npz, to_jsonable
from .stats import Interval, mean_ci
from .status import Verdict, combine, consistency, directional, not_testable
from ..reprs import compact_repr


RANK_POSITIONS = ("text", "text_after_first", "all")


def rank_collapse(resid: np.ndarray, start: int = 0) -> np.ndarray:
    """Rank-collapse residual ||V - 1 mu^T||_F / ||V||_F over tokens ``start:``.

    Args:
        resid: (..., T, d) token representations, e.g. ``Trace.resid`` (L+1, T, d).
        start: first token position included (1 drops a BOS token).

    Returns:
        (...) float64, e.g. (L+1,): values in [0, 1]; NaN where V is all zeros.
    """
    V = np.asarray(resid, dtype=np.float64)
    if V.ndim < 2:
        raise ValueError(f"resid must have shape (..., T, d), got {V.shape}")
    if not 0 <= start < V.shape[-2]:
        raise ValueError(f"start={start} leaves no tokens out of {V.shape[-2]}")
    V = V[..., start:, :]
    mu = V.mean(axis=-2, keepdims=True)
    num = np.sqrt(np.sum((V - mu) ** 2, axis=(-2, -1)))
    den = np.sqrt(np.sum(V ** 2, axis=(-2, -1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


@compact_repr
@dataclass
class Prop31:
    """Both sides of Prop. 3.1 per layer (see the module docstring); arrays of shape (...).

    Attributes:
        dev_frob: ||V - 1 mu^T||_F, float64, residual-stream units.
        last_two: ||v_T - v_{T-1}||_2 of the last two rows of V, float64, same units.
    """

    dev_frob: np.ndarray
    last_two: np.ndarray

    @property
    def holds(self) -> np.ndarray:
        """bool: ||v_T - v_{T-1}|| <= 2 ||V - 1 mu^T||_F (the implication for every Δ)."""
        return self.last_two <= 2.0 * self.dev_frob

    @property
    def slack(self) -> np.ndarray:
        """float64: ||v_T - v_{T-1}|| / (2 ||V - 1 mu^T||_F), in [0, 1/sqrt(2)] for exact
        arithmetic; NaN where V has identical rows (both sides 0)."""
        d = self.dev_frob
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(d > 0, self.last_two / np.where(d > 0, 2.0 * d, 1.0), np.nan)


def prop31_check(resid: np.ndarray, start: int = 0) -> Prop31:
    """Prop. 3.1's two sides for the token matrix V = ``resid[..., start:, :]``.

    Args:
        resid: (..., T, d) token representations, e.g. ``Trace.resid`` (L+1, T, d); computed
            in float64.
        start: first row of V (1 drops a BOS token); V needs >= 2 rows.

    Returns:
        :class:`Prop31` with (...) arrays, e.g. (L+1,): ``dev_frob``, ``last_two``, and the
        derived ``holds`` and ``slack``.
    """
    V = np.asarray(resid, dtype=np.float64)
    if V.ndim < 2:
        raise ValueError(f"resid must have shape (..., T, d), got {V.shape}")
    if not 0 <= start <= V.shape[-2] - 2:
        raise ValueError(f"start={start} leaves fewer than 2 tokens out of {V.shape[-2]}")
    V = V[..., start:, :]
    dev = np.sqrt(np.sum((V - V.mean(axis=-2, keepdims=True)) ** 2, axis=(-2, -1)))
    return Prop31(dev_frob=dev, last_two=np.linalg.norm(V[..., -1, :] - V[..., -2, :], axis=-1))


def _repeat_last(ids: np.ndarray) -> np.ndarray:
    return np.concatenate([ids, ids[-1:]])


def representational_collapse(model: Any, ids: Union[Sequence[int], np.ndarray],
                              relative: bool = False) -> np.ndarray:
    """Per-layer distance between the last token of ``ids`` and of ``ids`` + [ids[-1]].

    Args:
        model: a :class:`sinklab.Model`.
        ids: (T,) token ids exactly as run (prepend BOS yourself if wanted), T >= 1.
        relative: divide by ||v_T^(l)||_2.

    Returns:
        (L+1,) float64: ||v_T^(l) - v'_{T+1}^(l)||_2 (in residual-stream units), or relative.
        One forward pass of T+1 tokens, which must fit in the context.
    """
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ids must be a non-empty 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    check_length(model, len(arr) + 1, "sequence with its last token repeated")
    tr = model.run(_repeat_last(arr), capture=("resid",), progress=False)
    return _repr_from_resid(tr.resid, len(arr), relative)


def _repr_from_resid(resid: np.ndarray, T: int, relative: bool) -> np.ndarray:
    v = np.asarray(resid[:, T - 1, :], dtype=np.float64)
    w = np.asarray(resid[:, T, :], dtype=np.float64)
    d = np.linalg.norm(v - w, axis=-1)
    if relative:
        n = np.linalg.norm(v, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(n > 0, d / np.where(n > 0, n, 1.0), np.nan)
    return d


@compact_repr
@dataclass
class CollapseResult:
    """Collapse metrics as the context grows.

    Attributes:
        lengths: (n,) int64, numbers of text tokens T.
        settings: subset of ``["bos", "nobos"]``.
        rank: setting -> (n, L+1) float64 rank-collapse residual of the T-token prompt.
        repr_dist: setting -> (n, L+1) float64 ||v_T - v'_{T+1}||_2.
        last_norm: setting -> (n, L+1) float64 ||v_T||_2 (for relative distances).
        meta: model, BOS id, rank_positions, text ids used, ...
        dev_frob: setting -> (n, L+1) float64 ||V - 1 mu^T||_F (absolute; the numerator of
            ``rank``), V = the rows chosen by ``rank_positions``.
        last_two: setting -> (n, L+1) float64 ||v_T - v_{T-1}||_2, the last two text tokens of
            the T-token prompt (the last two rows of V).
    The Prop. 3.1 check: :meth:`prop31` (``holds``, ``slack``), in :meth:`summary` too.
    """

    lengths: np.ndarray
    settings: List[str]
    rank: Dict[str, np.ndarray]
    repr_dist: Dict[str, np.ndarray]
    last_norm: Dict[str, np.ndarray]
    meta: Dict[str, Any] = field(default_factory=dict)
    dev_frob: Dict[str, np.ndarray] = field(default_factory=dict)
    last_two: Dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def repr_rel(self) -> Dict[str, np.ndarray]:
        """setting -> (n, L+1): repr_dist / ||v_T||."""
        return {s: self.repr_dist[s] / self.last_norm[s] for s in self.settings}

    def prop31(self, setting: str) -> Prop31:
        """Prop. 3.1's two sides for one setting, (n, L+1) arrays (per T and layer)."""
        if setting not in self.dev_frob:
            raise ValueError(f"no Prop. 3.1 numbers for setting {setting!r} (settings: {self.settings})")
        return Prop31(dev_frob=self.dev_frob[setting], last_two=self.last_two[setting])

    def summary(self) -> Dict[str, Any]:
        """JSON-ready: per setting (n, L+1) lists (rows: lengths, columns: layers 0..L) of the
        rank-collapse residual, the representational-collapse distance (absolute and relative),
        and ``prop31``: ``dev_frob``, ``last_two``, ``holds``, ``slack`` with ``all_hold`` and
        ``max_slack`` (per setting, and ``prop31_all_hold`` over settings)."""
        out: Dict[str, Any] = {"meta": self.meta, "lengths": self.lengths, "settings": {}}
        ok = []
        for s in self.settings:
            out["settings"][s] = {"rank_collapse": self.rank[s], "repr_dist": self.repr_dist[s],
                                  "repr_rel": self.repr_rel[s]}
            if s in self.dev_frob:
                p = self.prop31(s)
                ok.append(bool(p.holds.all()))
                out["settings"][s]["prop31"] = {
                    "dev_frob": p.dev_frob, "last_two": p.last_two, "holds": p.holds, "slack": p.slack,
                    "all_hold": ok[-1], "max_slack": float(np.nanmax(p.slack)) if np.any(np.isfinite(p.slack))
                    else float("nan")}
        if ok:
            out["prop31_all_hold"] = all(ok)
        return to_jsonable(out)

    def save(self, path: str) -> None:
        """.npz with embedded JSON metadata; no pickle."""
        arrays = {"lengths": self.lengths}
        for s in self.settings:
            arrays[f"rank_{s}"] = self.rank[s]
            arrays[f"repr_dist_{s}"] = self.repr_dist[s]
            arrays[f"last_norm_{s}"] = self.last_norm[s]
            if s in self.dev_frob:
                arrays[f"dev_frob_{s}"] = self.dev_frob[s]
                arrays[f"last_two_{s}"] = self.last_two[s]
        save_npz(path, arrays, {"settings": self.settings, "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "CollapseResult":
        a, m = load_npz(path)
        st = list(m["settings"])
        return cls(lengths=a["lengths"], settings=st, rank={s: a[f"rank_{s}"] for s in st},
                   repr_dist={s: a[f"repr_dist_{s}"] for s in st},
                   last_norm={s: a[f"last_norm_{s}"] for s in st}, meta=dict(m["meta"]),
                   dev_frob={s: a[f"dev_frob_{s}"] for s in st if f"dev_frob_{s}" in a},
                   last_two={s: a[f"last_two_{s}"] for s in st if f"last_two_{s}" in a})


def collapse_vs_length(model: Any, text: Union[str, Sequence[int], np.ndarray],
                       lengths: Sequence[int] = (8, 16, 32, 64, 128, 256), bos: BosArg = "both",
                       rank_positions: str = "text_after_first", progress: bool = True) -> CollapseResult:
    """Rank and representational collapse of the first T tokens of a passage, for each T.

    Args:
        model: a :class:`sinklab.Model`.
        text: a passage (tokenized without BOS) or its token ids; needs >= max(lengths) tokens.
        lengths: numbers of text tokens T (each >= 3). With BOS the run has T+1 tokens, plus one
            for the repeated last token; all must fit in the context (checked before running).
        bos: ``True``, ``False`` or ``"both"``.
        rank_positions: rows of V for the rank-collapse residual: ``"text_after_first"``
            (default: text tokens 1..T-1), ``"text"`` (the T text tokens) or ``"all"`` (with BOS).
        progress: tqdm bar over the len(lengths) × settings forward passes.

    Returns:
        :class:`CollapseResult` with (len(lengths), L+1) arrays per setting, including both
        sides of Prop. 3.1 on the rank-collapse rows (``dev_frob``, ``last_two``, ``prop31``).
    """
    settings = conditions(bos)
    if rank_positions not in RANK_POSITIONS:
        raise ValueError(f"rank_positions must be one of {RANK_POSITIONS}, got {rank_positions!r}")
    Ts = np.asarray([int(t) for t in lengths], dtype=np.int64)
    if Ts.size == 0:
        raise ValueError("lengths is empty")
    if Ts.min() < 3:
        raise ValueError(f"every length must be >= 3 tokens, got {Ts.tolist()}")
    extra = 1 + (1 if BOS in settings else 0)
    check_length(model, int(Ts.max()) + extra,
                 f"length T={int(Ts.max())} (+{extra} for {'BOS and ' if extra == 2 else ''}the repeated "
                 f"token): a sequence")
    ids = text_ids(model, text)
    if len(ids) < Ts.max():
        raise ValueError(f"the text has {len(ids)} tokens, fewer than the longest requested length "
                         f"{int(Ts.max())}")
    L = model.config.n_layers
    rank = {s: np.empty((len(Ts), L + 1)) for s in settings}
    rdist = {s: np.empty((len(Ts), L + 1)) for s in settings}
    lnorm = {s: np.empty((len(Ts), L + 1)) for s in settings}
    dev = {s: np.empty((len(Ts), L + 1)) for s in settings}
    last2 = {s: np.empty((len(Ts), L + 1)) for s in settings}
    jobs = [(i, s) for i in range(len(Ts)) for s in settings]
    for i, s in progress_bar(jobs, progress, desc="collapse vs length", unit="run", leave=False):
        T = int(Ts[i])
        seq = prepare(model, ids[:T], s)       # T text tokens, the BOS on top
        off = 1 if s == BOS else 0
        tr = model.run(_repeat_last(seq), capture=("resid",), progress=False)
        resid = tr.resid
        n = len(seq)
        start = {"text": off, "text_after_first": off + 1, "all": 0}[rank_positions]
        rank[s][i] = rank_collapse(resid[:, :n, :], start=start)
        p = prop31_check(resid[:, :n, :], start=start)
        dev[s][i], last2[s][i] = p.dev_frob, p.last_two
        rdist[s][i] = _repr_from_resid(resid, n, relative=False)
        lnorm[s][i] = np.linalg.norm(np.asarray(resid[:, n - 1, :], dtype=np.float64), axis=-1)
    meta = {"model": getattr(model, "name", None), "bos_token_id": model.config.bos_token_id,
            "bos_token": model.token_text(model.config.bos_token_id), "rank_positions": rank_positions, "n_text_tokens": int(len(ids)),
            "ids": ids[: int(Ts.max())].tolist()}
    return CollapseResult(lengths=Ts, settings=settings, rank=rank, repr_dist=rdist, last_norm=lnorm, meta=meta,
                          dev_frob=dev, last_two=last2)


# ---------------------------------------------------------------------------------- units of text
PASSAGE_SEPARATOR = "\n\n"


def passage_units(model: Any, passages: Sequence[str], n_tokens: int, n_units: int,
                  sep: str = PASSAGE_SEPARATOR) -> List[np.ndarray]:
    """``n_units`` independent token sequences of ``n_tokens`` text tokens each (no BOS), built
    from the passages in order: unit 0 is passage 0, then passage 1, ... (each tokenized on its
    own as ``passage + sep``, without BOS, and the ids concatenated) until it has ``n_tokens``
    tokens; unit 1 starts at the next unused passage, and so on. No passage is used by two units
    (the units are the independent draws the bootstrap resamples). When the first passage has
    at least ``n_tokens`` tokens the unit is that passage cut to them; otherwise it is a
    concatenation of consecutive passages, cut. A shorter length T reads the first T tokens of
    the same unit (nested prefixes), so the trend over T is measured within each unit. A passage
    given as token ids (no BOS) is used as is, without a separator.

    Returns:
        list of (n_tokens,) int64 arrays (:func:`passage_unit_spans` gives the passage indices of each).

    Raises:
        ValueError: the passages run out before ``n_units`` units are complete.
    """
    return [ids for ids, _ in units_with_spans(model, passages, n_tokens, n_units, sep)]


def passage_unit_spans(model: Any, passages: Sequence[str], n_tokens: int, n_units: int,
                       sep: str = PASSAGE_SEPARATOR) -> List[List[int]]:
    """The passage indices each unit of :func:`passage_units` is made of (same arguments)."""
    return [span for _, span in units_with_spans(model, passages, n_tokens, n_units, sep)]


def units_with_spans(model: Any, passages: Sequence[Any], n_tokens: int, n_units: int,
                     sep: str = PASSAGE_SEPARATOR) -> List[Tuple[np.ndarray, List[int]]]:
    """:func:`passage_units` and :func:`passage_unit_spans` together: one
    ``((n_tokens,) int64 ids, passage indices)`` pair per unit (same arguments and errors)."""
    n_tokens, n_units = int(n_tokens), int(n_units)
    if n_tokens < 1 or n_units < 1:
        raise ValueError(f"need n_tokens >= 1 and n_units >= 1, got {n_tokens} and {n_units}")
    out = []
    k = 0
    for _ in range(n_units):
        ids: List[int] = []
        span: List[int] = []
        while len(ids) < n_tokens:
            if k >= len(passages):
                raise ValueError(f"{len(passages)} passages give only {len(out)} units of {n_tokens} tokens, "
                                 f"{n_units} asked for (units never share a passage)")
            p = passages[k]
            ids.extend(int(i) for i in text_ids(model, p + sep if isinstance(p, str) else p))
            span.append(k)
            k += 1
        out.append((np.asarray(ids[:n_tokens], np.int64), span))
    return out


def default_passages(passages: Optional[Sequence[str]]) -> List[str]:
    """``passages`` as a list (strings or token-id arrays), or the shipped passages, split
    ``"sinks"``, when None; TypeError for one string."""
    if passages is None:
        return load_passages("sinks")
    if isinstance(passages, str):
        raise TypeError("passages must be a sequence of strings (or of token-id arrays), not one string")
    return list(passages)


# ---------------------------------------------------------------------------------- trends
def ols_slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of ``y`` against ``x`` along the last axis (float64):
    sum((x - x̄)(y - ȳ)) / sum((x - x̄)²); NaN where any y is NaN or x has one value."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.ndim != 1 or y.shape[-1] != x.shape[0]:
        raise ValueError(f"x must be 1-D with the length of y's last axis, got {x.shape} and {y.shape}")
    xc = x - x.mean()
    sxx = float((xc ** 2).sum())
    if x.size < 2 or sxx == 0:
        return np.full(y.shape[:-1], np.nan)
    yc = y - y.mean(axis=-1, keepdims=True)
    return (yc * xc).sum(axis=-1) / sxx


TREND_MEASURES = ("rank", "repr_rel", "repr_dist")


@compact_repr
@dataclass
class CollapseTrend:
    """Collapse measures per (unit, T, layer) over independent passage units, and their trends.

    Attributes:
        lengths: (nT,) int64 numbers of text tokens T (with BOS the run has T+1 tokens).
        settings: subset of ``["bos", "nobos"]``.
        rank: setting -> (P, nT, L+1) float64 rank-collapse residual ||V - 1 mu^T||_F / ||V||_F
            (V = the rows chosen by ``meta["rank_positions"]``, default text tokens 1..T-1).
        repr_dist: setting -> (P, nT, L+1) ||v_T - v'_{T+1}||_2 (residual-stream units).
        last_norm: setting -> (P, nT, L+1) ||v_T||_2 (repr_rel = repr_dist / last_norm).
        dev_frob, last_two: setting -> (P, nT, L+1) the two sides of Prop. 3.1 (:meth:`prop31`).
        meta: model, passage spans of every unit, depth_layers, ...

    Trends (each per unit, then a bootstrap interval over units, :func:`sinklab.analysis.stats.mean_ci`):

    * over depth, :meth:`depth_slope`: OLS slope of the measure vs the layer index l over
      ``depth_layers`` (default 1..L: the embeddings are not mixed, and the repeated token's
      embedding is identical, so repr distance is 0 at l = 0), per (unit, T); ``depth_ci``
      averages the per-T slopes within each unit;
    * over context, :meth:`context_slope`: OLS slope vs log T (natural log) at one layer (default
      the last) or of the mean over ``depth_layers``.

    The paper's claim (collapse grows with depth and length) is a *negative* slope of the
    residual and of the relative distance (tokens more alike): :func:`criterion_collapse`.
    """

    lengths: np.ndarray
    settings: List[str]
    rank: Dict[str, np.ndarray]
    repr_dist: Dict[str, np.ndarray]
    last_norm: Dict[str, np.ndarray]
    dev_frob: Dict[str, np.ndarray]
    last_two: Dict[str, np.ndarray]
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return int(self.rank[self.settings[0]].shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.rank[self.settings[0]].shape[2] - 1)

    @property
    def depth_layers(self) -> List[int]:
        d = self.meta.get("depth_layers")
        return list(range(1, self.n_layers + 1)) if d is None else [int(l) for l in d]

    def measure(self, name: str, setting: Optional[str] = None) -> np.ndarray:
        """(P, nT, L+1) float64 of ``"rank"``, ``"repr_rel"`` or ``"repr_dist"``."""
        s = self._setting(setting)
        if name == "rank":
            return self.rank[s]
        if name == "repr_dist":
            return self.repr_dist[s]
        if name == "repr_rel":
            n = self.last_norm[s]
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(n > 0, self.repr_dist[s] / np.where(n > 0, n, 1.0), np.nan)
        raise ValueError(f"measure must be one of {TREND_MEASURES}, got {name!r}")

    def _setting(self, setting: Optional[str]) -> str:
        s = self.settings[0] if setting is None else condition(setting)
        if s not in self.settings:
            raise ValueError(f"setting {s!r} not run (settings: {self.settings})")
        return s

    def depth_slope(self, measure: str = "rank", setting: Optional[str] = None) -> np.ndarray:
        """(P, nT) slope of the measure vs layer index over ``depth_layers``, per unit and T."""
        m = self.measure(measure, setting)[:, :, self.depth_layers]
        return ols_slope(np.asarray(self.depth_layers, np.float64), m)

    def context_slope(self, measure: str = "rank", layer: Union[int, str] = -1,
                      setting: Optional[str] = None) -> np.ndarray:
        """(P,) slope of the measure vs log T, at ``layer`` (an index into 0..L, -1 = L) or, for
        ``layer="mean"``, of its mean over ``depth_layers``."""
        m = self.measure(measure, setting)
        y = m[:, :, self.depth_layers].mean(axis=2) if layer == "mean" else m[:, :, int(layer)]
        return ols_slope(np.log(self.lengths.astype(np.float64)), y)

    def depth_ci(self, measure: str = "rank", setting: Optional[str] = None) -> Interval:
        """Bootstrap interval over units of the depth slope (each unit's slopes averaged over T)."""
        return mean_ci(self.depth_slope(measure, setting).mean(axis=1))

    def context_ci(self, measure: str = "rank", layer: Union[int, str] = -1,
                   setting: Optional[str] = None) -> Interval:
        """Bootstrap interval over units of :meth:`context_slope`."""
        return mean_ci(self.context_slope(measure, layer, setting))

    def mean_ci(self, measure: str = "rank", setting: Optional[str] = None) -> List[List[Interval]]:
        """``[T][layer]`` bootstrap intervals over units of the measure itself."""
        m = self.measure(measure, setting)
        return [[mean_ci(m[:, i, l]) for l in range(m.shape[2])] for i in range(m.shape[1])]

    def depth_mean_ci(self, measure: str = "rank", setting: Optional[str] = None) -> List[Interval]:
        """[T] bootstrap intervals over units of the measure's mean over ``depth_layers``."""
        m = self.measure(measure, setting)[:, :, self.depth_layers].mean(axis=2)
        return [mean_ci(m[:, i]) for i in range(m.shape[1])]

    def prop31(self, setting: Optional[str] = None) -> Prop31:
        """Prop. 3.1's two sides, (P, nT, L+1) arrays."""
        s = self._setting(setting)
        return Prop31(dev_frob=self.dev_frob[s], last_two=self.last_two[s])

    def summary(self) -> Dict[str, Any]:
        """JSON-ready: per setting and measure the trends with intervals (depth slope per T and
        averaged, context slope at the last layer and averaged over layers), the per-(T, layer)
        means with intervals, the verdicts of :func:`criterion_collapse` (rank residual and
        relative distance) and :func:`criterion_prop31`."""
        out: Dict[str, Any] = {"meta": self.meta, "lengths": self.lengths, "n_units": self.n_units,
                               "depth_layers": self.depth_layers, "settings": {}}
        for s in self.settings:
            row: Dict[str, Any] = {}
            for name in ("rank", "repr_rel"):
                ds = self.depth_slope(name, s)
                row[name] = {
                    "depth_slope": self.depth_ci(name, s).to_dict(),
                    "depth_slope_by_T": [mean_ci(ds[:, i]).to_dict() for i in range(ds.shape[1])],
                    "context_slope_last": self.context_ci(name, -1, s).to_dict(),
                    "context_slope_mean": self.context_ci(name, "mean", s).to_dict(),
                    "mean": [[iv.to_dict() for iv in r] for r in self.mean_ci(name, s)],
                    "verdict": criterion_collapse(self, measure=name, setting=s).to_dict()}
            p = self.prop31(s)
            row["prop31"] = {"verdict": criterion_prop31(p).to_dict(),
                             "max_slack": float(np.nanmax(p.slack)) if np.any(np.isfinite(p.slack)) else None}
            out["settings"][s] = row
        return to_jsonable(out)

    def save(self, path: str) -> str:
        """.npz with embedded JSON metadata; no pickle. Returns the file written."""
        arrays: Dict[str, np.ndarray] = {"lengths": self.lengths}
        for s in self.settings:
            for k in ("rank", "repr_dist", "last_norm", "dev_frob", "last_two"):
                arrays[f"{k}_{s}"] = getattr(self, k)[s]
        return save_npz(path, arrays, {"kind": "collapse_trend", "settings": self.settings, "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "CollapseTrend":
        a, m = load_npz(path)
        if m.get("kind") != "collapse_trend":
            raise ValueError(f"{path} is not a saved collapse trend")
        st = list(m["settings"])
        g = {k: {s: a[f"{k}_{s}"] for s in st} for k in ("rank", "repr_dist", "last_norm", "dev_frob", "last_two")}
        return cls(lengths=a["lengths"], settings=st, meta=dict(m["meta"]), **g)


def collapse_trend(model: Any, passages: Optional[Sequence[str]] = None,
                   lengths: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024), bos: BosArg = True,
                   n_passages: int = 10, rank_positions: str = "text_after_first",
                   depth_layers: Optional[Sequence[int]] = None, progress: bool = True) -> CollapseTrend:
    """Rank and representational collapse per (passage unit, T, layer) and their trends.

    Args:
        model: a :class:`sinklab.Model`.
        passages: the passages (default: ``sinklab.prompts.load_passages("sinks")``); they are
            grouped into ``n_passages`` disjoint units of max(lengths) tokens
            (:func:`passage_units`: one passage, or consecutive passages joined by a blank line
            when one is shorter than the longest T).
        lengths: numbers of text tokens T (>= 3, at least 2 values for a context trend).
        bos: ``True`` (default: BOS + T text tokens), ``False`` or ``"both"``.
        n_passages: number of independent units (the bootstrap's units; >= 10 for a verdict
            worth reading).
        rank_positions: rows of V, as in :func:`collapse_vs_length`.
        depth_layers: the layers of the depth slope (default 1..L).
        progress: a bar over the units.

    Returns:
        :class:`CollapseTrend`. Costs n_passages x len(lengths) x settings forward passes.
    """
    pas = default_passages(passages)
    Ts = sorted({int(t) for t in lengths})
    if not Ts:
        raise ValueError("lengths is empty")
    L = model.config.n_layers
    if depth_layers is not None:
        bad = [l for l in depth_layers if not 0 <= int(l) <= L]
        if bad or len(set(depth_layers)) < 2:
            raise ValueError(f"depth_layers must hold >= 2 layers in [0, {L}], got {list(depth_layers)}")
    units = units_with_spans(model, pas, max(Ts), n_passages, PASSAGE_SEPARATOR)
    settings = conditions(bos)
    keys = ("rank", "repr_dist", "last_norm", "dev_frob", "last_two")
    arr = {k: {s: np.empty((len(units), len(Ts), L + 1)) for s in settings} for k in keys}
    for u, (ids, _) in enumerate(progress_bar(units, progress, desc="collapse trend", unit="unit")):
        r = collapse_vs_length(model, ids, lengths=Ts, bos=bos, rank_positions=rank_positions, progress=False)
        for s in settings:
            arr["rank"][s][u], arr["repr_dist"][s][u], arr["last_norm"][s][u] = r.rank[s], r.repr_dist[s], r.last_norm[s]
            arr["dev_frob"][s][u], arr["last_two"][s][u] = r.dev_frob[s], r.last_two[s]
    meta = {"model": getattr(model, "name", None), "bos_token_id": model.config.bos_token_id,
            "bos_token": model.token_text(model.config.bos_token_id), "rank_positions": rank_positions, "units": [span for _, span in units],
            "separator": PASSAGE_SEPARATOR,
            "depth_layers": None if depth_layers is None else sorted(int(l) for l in set(depth_layers))}
    return CollapseTrend(lengths=np.asarray(Ts, np.int64), settings=settings, meta=meta, **arr)


# ---------------------------------------------------------------------------------- criteria
COLLAPSE_CLAIM = ("over-mixing (collapse) grows with depth and with context length: the measure falls "
                  "(tokens more alike) as the layer index and log T grow")


def criterion_collapse(result: CollapseTrend, measure: str = "rank", setting: Optional[str] = None) -> Verdict:
    """The paper's claim that collapse grows with depth and with context length, in two parts,
    both required (status.combine):

    1. depth: the mean over units of the slope of ``measure`` vs layer index (over
       ``depth_layers``, averaged over T within each unit) is < 0, its 95% interval below 0;
    2. context: the mean over units of the slope of ``measure`` vs log T at the last layer is < 0.

    Each part is :func:`sinklab.analysis.status.directional` with ``predicted=-1``: reproduced
    when the interval lies below 0, contradicted when above, else inconclusive. Written from the
    claim, not from any measured result; the layer-averaged context slope is reported beside it
    (:meth:`CollapseTrend.summary`) but is not part of the rule. Fewer than 2 lengths make the
    context part not testable."""
    s = result._setting(setting)
    label = {"rank": "rank-collapse residual", "repr_rel": "relative representational-collapse distance",
             "repr_dist": "representational-collapse distance"}[measure]
    depth = directional(result.depth_ci(measure, s), -1, f"slope of the {label} vs layer ({s})", spec=".4f")
    if len(result.lengths) < 2:
        ctx = not_testable(f"one length only ({int(result.lengths[0])}): no trend over context")
    else:
        ctx = directional(result.context_ci(measure, -1, s), -1,
                          f"slope of the last-layer {label} vs log T ({s})", spec=".4f")
    return combine(depth, ctx, what=f"collapse grows with depth and context ({label})")


PROP31_SLACK_MAX = 1 / np.sqrt(2)


def criterion_prop31(checks: Union[Prop31, Sequence[Prop31], Dict[str, Prop31]], tol: float = 1e-9) -> Verdict:
    """Prop. 3.1 as a consistency check (status.consistency): it is a theorem about the numbers,
    so it can only fail through a bug. A case is one (T, layer, ...) entry of every
    :func:`prop31_check` result given (a :class:`Prop31`, a list or a dict of them); it passes when
    the implication holds (``||v_T - v_{T-1}|| <= 2||V - 1 mu^T||_F``) and the slack is within the
    triangle-inequality bound 1/sqrt(2) (+ ``tol``). Cases where V has identical rows (both
    sides 0) pass."""
    if isinstance(checks, Prop31):
        items = [checks]
    elif isinstance(checks, dict):
        items = list(checks.values())
    else:
        items = list(checks)
    if not items:
        raise ValueError("criterion_prop31: no Prop. 3.1 results")
    holds = cases = 0
    for p in items:
        h = np.asarray(p.holds, bool)
        sl = np.asarray(p.slack, np.float64)
        ok = h & ~(np.isfinite(sl) & (sl > PROP31_SLACK_MAX + tol))
        holds += int(ok.sum())
        cases += int(ok.size)
    return consistency(holds, cases, "Prop. 3.1 (||v_T - v_{T-1}|| <= 2||V - 1 mu^T||_F, slack <= 1/sqrt(2))")
