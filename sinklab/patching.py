"""Activation patching: arrays that replace, or are added to, activations inside the C forward.

A :class:`Patch` names a capture point (the names of :meth:`sinklab.Model.run`'s captures, or a
TransformerLens hook name as an alias), a layer, and which batch rows, positions and heads it
touches; ``model.run(ids, patch=[...])`` applies every patch right after the C core computes the
activation and before anything reads or captures it, so a capture of the same point shows the
patched value and every later layer computes from it.

===========  ==========================  ============================  ==========================
point        per-row value shape          where it acts                 TransformerLens alias
===========  ==========================  ============================  ==========================
``resid``    (P, d)                      stream entering layer l;      ``blocks.{l}.hook_resid_pre``
                                         layer L: before the final     (``hook_resid_post`` is
                                         norm                          layer l + 1)
``attn_out`` (P, d)                      attention block's addition    ``blocks.{l}.hook_attn_out``
``mlp_out``  (P, d)                      the MLP's addition            ``blocks.{l}.hook_mlp_out``
``head_out`` (h, P, d)                   z_h W_O[:, h]^T inside the    ``blocks.{l}.attn.hook_result``
                                         W_O product (before Gemma's
                                         post-norm)
``z``        (h, P, hd)                  what W_O reads, per head      ``blocks.{l}.attn.hook_z``
``q``        (h, P, hd)                  queries after RoPE            ``blocks.{l}.attn.hook_rot_q``
``k``        (g, P, hd)                  keys after RoPE, kv heads     ``blocks.{l}.attn.hook_rot_k``
``v``        (g, P, hd)                  values, kv heads              ``blocks.{l}.attn.hook_v``
``pattern``  (h, P, T)                   attention probabilities of    ``blocks.{l}.attn.hook_pattern``
                                         the query rows P
===========  ==========================  ============================  ==========================

P = number of selected positions, h / g = number of selected heads (query heads, or kv heads for
``k`` and ``v``). A value may also carry a leading axis of one entry per selected batch row;
without it, the same value goes to every selected row.

Checked against TransformerLens 4's hooks themselves (tests/test_patching_tl.py). Where sinklab and
TransformerLens differ: head-indexed activations are head-major here (TL puts
position first, ``(pos, head, d_head)``), so TL arrays need ``.transpose(1, 0, 2)``; TL's
``hook_q``/``hook_k`` are *before* RoPE while sinklab's ``q``/``k`` are after it, so those two
aliases are accepted only for models without rotary positions (use ``hook_rot_q``/``hook_rot_k``).
A ``pattern`` patch replaces (or adds to) the probabilities of the chosen query rows over every
key of the sequence, future keys included, as a TL hook on ``hook_pattern`` does; the head's ``z``
is then P'V (times its ``head_scale``), the ``attn`` capture shows P', and the streamed
statistics (``stats``: importance, attention to position 0, entropy) stay those of the model's own
probabilities. A pattern patch on a head that also has ``mask_first`` or ``zero_first_value`` is
refused. Positions at or beyond a sequence's length (padding) are never patched.

The derivatives (``Model.vjp``, ``jvp``, ``jacobian``) take the same patches on their one sequence:
a replaced entry is a constant (no derivative flows through it; a replaced pattern row passes
gradient to V only), an added one changes no derivative.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

POINTS: Tuple[str, ...] = ("resid", "attn_out", "mlp_out", "head_out", "z", "q", "k", "v", "pattern")
"""Patchable points, in the order of the C core's numbering (csrc/patch.h)."""

STREAM_POINTS = ("resid", "attn_out", "mlp_out")
MODES: Tuple[str, ...] = ("replace", "add")

_TL_HOOKS = {"hook_resid_pre": ("resid", 0), "hook_resid_post": ("resid", 1), "hook_attn_out": ("attn_out", 0),
             "hook_mlp_out": ("mlp_out", 0), "attn.hook_result": ("head_out", 0), "attn.hook_z": ("z", 0),
             "attn.hook_rot_q": ("q", 0), "attn.hook_rot_k": ("k", 0), "attn.hook_v": ("v", 0),
             "attn.hook_pattern": ("pattern", 0), "attn.hook_q": ("q", 0), "attn.hook_k": ("k", 0)}
_TL_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")
_PRE_ROPE = ("attn.hook_q", "attn.hook_k")


def resolve_point(name: str, layer: Optional[int]) -> Tuple[str, int, Optional[str]]:
    """(point, layer, TL hook or None) of a capture name or TransformerLens hook name.

    ``blocks.{l}.hook_resid_post`` is ``resid`` at layer l + 1. ValueError for an unknown name, a
    missing layer, or a layer that disagrees with the one in the hook name."""
    if not isinstance(name, str):
        raise TypeError(f"patch point must be a string, got {type(name).__name__}")
    if name in POINTS:
        if layer is None:
            raise ValueError(f"patch at {name!r} needs a layer")
        return name, int(layer), None
    m = _TL_NAME.match(name)
    if not m or m.group(2) not in _TL_HOOKS:
        raise ValueError(f"unknown patch point {name!r}: use one of {POINTS} (with layer=) or a TransformerLens "
                         f"hook name such as 'blocks.3.hook_resid_pre' ({sorted(_TL_HOOKS)})")
    point, shift = _TL_HOOKS[m.group(2)]
    at = int(m.group(1)) + shift
    if layer is not None and int(layer) != at:
        raise ValueError(f"patch {name!r} is layer {at} ({point}), but layer={layer} was given")
    return point, at, m.group(2)


def _index(spec: Any, what: str) -> Optional[np.ndarray]:
    """None (all) or an int64 array of distinct indices >= 0 (the upper bound is the model's)."""
    if spec is None:
        return None
    arr = np.atleast_1d(np.asarray(spec))
    if arr.ndim != 1 or arr.size == 0 or not (np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"patch {what} must be None, an int or a non-empty sequence of ints, got {spec!r}")
    if len(np.unique(arr)) != arr.size:
        raise ValueError(f"patch {what} {arr.tolist()} has repeated entries")
    if arr.min() < 0:
        raise ValueError(f"patch {what} {int(arr.min())} is negative")
    return arr.astype(np.int64)


def _value(value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.float32:
        out = arr
    elif np.issubdtype(arr.dtype, np.floating):
        out = arr.astype(np.float32)
    else:
        raise TypeError(f"patch value must be a floating-point array, got dtype {arr.dtype}")
    if not np.all(np.isfinite(out)):
        raise ValueError("patch value has non-finite entries (nan or inf)")
    return out


@dataclass(frozen=True)
class Patch:
    """One patch: ``value`` replaces (``mode="replace"``) or is added to (``mode="add"``) the
    activation ``point`` of ``layer`` at the chosen batch rows, positions and heads.

    Attributes:
        point: a name of :data:`POINTS` or a TransformerLens hook name (module docstring); a hook
            name carries its layer, so ``layer`` may then be omitted.
        value: float array (float32 kept, other float dtypes converted, anything else refused), of
            the per-row shape in the module's table, optionally with a leading axis of one entry
            per selected row; shape checked against the model at run time.
        layer: the layer (``resid``: 0..L, L being the stream before the final norm).
        mode: ``"replace"`` or ``"add"``.
        positions: None (every position 0..T-1) or the positions patched.
        heads: None (every head) or the heads patched; only for head-indexed points (``k``/``v``:
            kv heads).
        rows: None (every sequence of the batch) or the batch rows patched.
    """

    point: str
    value: Any
    layer: Optional[int] = None
    mode: str = "replace"
    positions: Any = None
    heads: Any = None
    rows: Any = None

    def __post_init__(self) -> None:
        name, layer, hook = resolve_point(self.point, self.layer)
        if self.mode not in MODES:
            raise ValueError(f"patch mode {self.mode!r}; expected 'replace' or 'add'")
        if name in STREAM_POINTS and self.heads is not None:
            raise ValueError(f"patch at {name!r} takes no heads (it is the whole stream's row)")
        object.__setattr__(self, "point", name)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "_hook", hook)
        object.__setattr__(self, "value", _value(self.value))
        for f in ("positions", "heads", "rows"):
            object.__setattr__(self, f, _index(getattr(self, f), f))

    def core(self, dims: "PatchDims", B: int, T: int) -> Tuple:
        """The C core's tuple (point, mode, layer, rows, heads, positions, value) for a batch of B
        sequences of T positions, every index and the value's shape checked (ValueError)."""
        top = dims.n_layers if self.point == "resid" else dims.n_layers - 1
        if not 0 <= self.layer <= top:
            raise ValueError(f"patch at {self.point!r}: layer {self.layer} outside [0, {top}]")
        if self._hook in _PRE_ROPE and dims.rope:
            raise ValueError(f"{self._hook!r} is TransformerLens's query/key before RoPE; sinklab's q/k are after "
                             f"it: use 'attn.hook_rot_{self._hook[-1]}' (or point={self._hook[-1]!r})")
        rows = self._within(self.rows, B, "rows")
        pos = self._within(self.positions, T, "positions")
        n_heads = dims.heads_of(self.point)
        heads = None if n_heads == 0 else self._within(self.heads, n_heads, "heads")
        width = {"pattern": T, "z": dims.head_dim, "q": dims.head_dim, "k": dims.head_dim,
                 "v": dims.head_dim}.get(self.point, dims.d_model)
        per_row = (len(pos), width) if heads is None else (len(heads), len(pos), width)
        v = self.value
        if v.shape == per_row:
            v = np.broadcast_to(v, (len(rows),) + per_row)
        elif v.shape != (len(rows),) + per_row:
            raise ValueError(f"patch at {self.point!r} layer {self.layer}: value has shape {v.shape}, expected "
                             f"{per_row} (one row) or {(len(rows),) + per_row} (one per selected batch row)")
        return (POINTS.index(self.point), MODES.index(self.mode), self.layer, rows, heads, pos,
                np.ascontiguousarray(v, dtype=np.float32))

    def _within(self, idx: Optional[np.ndarray], n: int, what: str) -> np.ndarray:
        if idx is None:
            return np.arange(n, dtype=np.int64)
        if idx.max() >= n:
            raise ValueError(f"patch at {self.point!r} layer {self.layer}: {what} {int(idx.max())} outside [0, {n})")
        return idx


@dataclass(frozen=True)
class PatchDims:
    """The model sizes a patch is checked against."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    head_dim: int
    rope: bool

    def heads_of(self, point: str) -> int:
        """Heads of a head-indexed point (kv heads for k and v), 0 for the stream points."""
        if point in STREAM_POINTS:
            return 0
        return self.n_kv_heads if point in ("k", "v") else self.n_heads


def check_patches(patch: Any) -> List[Patch]:
    """``patch`` (None, one :class:`Patch` or an iterable of them) as a list; TypeError otherwise."""
    if patch is None:
        return []
    items = [patch] if isinstance(patch, Patch) else list(patch)
    bad = [type(p).__name__ for p in items if not isinstance(p, Patch)]
    if bad:
        raise TypeError(f"patch must be a Patch or a list of Patch, got {bad}")
    return items


def chunk_patches(patches: Sequence[Patch], dims: PatchDims, B: int, T: int, b0: int, b1: int) -> List[Tuple]:
    """The C tuples of ``patches`` for batch rows [b0, b1) of a B-row batch, rows renumbered from 0:
    a patch with no row in the chunk is left out; its value rows are sliced to those in it."""
    out = []
    for p in patches:
        point, mode, layer, rows, heads, pos, value = p.core(dims, B, T)
        keep = (rows >= b0) & (rows < b1)
        if not keep.any():
            continue
        if keep.all() and b0 == 0 and b1 >= B:
            out.append((point, mode, layer, rows, heads, pos, value))
            continue
        out.append((point, mode, layer, np.ascontiguousarray(rows[keep] - b0), heads, pos,
                    np.ascontiguousarray(value[keep])))
    return out


def patch_dims(config: Any, rope: bool) -> PatchDims:
    """:class:`PatchDims` of a :class:`sinklab.ModelConfig`."""
    return PatchDims(config.n_layers, config.n_heads, config.n_kv_heads, config.d_model, config.head_dim, bool(rope))


def derivative_patches(patches: Sequence[Patch], dims: PatchDims, T: int, t_eff: int) -> Optional[List[Tuple]]:
    """The C tuples of ``patches`` for a derivative of one sequence of T positions of which the
    first ``t_eff`` are run (later ones cannot influence the output): positions >= t_eff are
    dropped, and a pattern patch's keys >= t_eff too (ValueError when it puts weight on one: the
    patched row would then read a position the derivative does not run). ValueError for rows
    other than [0]. None when nothing is left."""
    out = []
    for p in patches:
        if p.rows is not None and list(p.rows) != [0]:
            raise ValueError(f"a derivative runs one sequence: patch rows must be None or [0], got {list(p.rows)}")
        point, mode, layer, rows, heads, pos, value = p.core(dims, 1, T)
        keep = pos < t_eff
        if not keep.any():
            continue
        value = value[..., keep, :]
        if p.point == "pattern":
            if np.any(value[..., t_eff:] != 0):
                raise ValueError(f"pattern patch at layer {p.layer} puts weight on keys at or after position {t_eff}, "
                                 f"which cannot influence the output in a causal model and are not run")
            value = value[..., :t_eff]
        out.append((point, mode, layer, rows, heads, np.ascontiguousarray(pos[keep]), np.ascontiguousarray(value)))
    return out or None
