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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Union

import numpy as np

from ..inputs import BOS, BosArg, check_length, conditions, prepare, text_ids
from ..progress import progress_bar
from ..results import load_npz, save_npz, to_jsonable


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
            "rank_positions": rank_positions, "n_text_tokens": int(len(ids)),
            "ids": ids[: int(Ts.max())].tolist()}
    return CollapseResult(lengths=Ts, settings=settings, rank=rank, repr_dist=rdist, last_norm=lnorm, meta=meta,
                          dev_frob=dev, last_two=last2)
