"""What one forward pass captured, as NumPy arrays, with save/load to .npz."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from .results import load_npz, save_npz


class Buffer(NamedTuple):
    """One float32 array the C forward fills: its name (a Trace attribute, or an
    :class:`AttentionStats` field), the capture name of :meth:`sinklab.Model.run` that asks for
    it, and its per-sequence axes (without the batch axis), named as in :data:`AXES`."""

    name: str
    capture: str
    axes: Tuple[str, ...]


# The one capture table: every buffer of Model.run, in the order captures are listed. Shapes,
# byte counts, the token axes batching cuts and the Trace fields all come from it.
BUFFERS: Tuple[Buffer, ...] = (
    Buffer("attn", "attn", ("layer", "head", "pos", "key")),
    Buffer("resid", "resid", ("stream", "pos", "d_model")),
    Buffer("logits", "logits", ("logit_pos", "vocab")),
    Buffer("importance", "stats", ("layer", "head", "key")),
    Buffer("to_first", "stats", ("layer", "head", "pos")),
    Buffer("entropy", "stats", ("layer", "head", "pos")),
    Buffer("q", "q", ("layer", "head", "pos", "head_dim")),
    Buffer("k", "k", ("layer", "kv_head", "pos", "head_dim")),
    Buffer("v", "v", ("layer", "kv_head", "pos", "head_dim")),
    Buffer("z", "z", ("layer", "head", "pos", "head_dim")),
    Buffer("head_out", "head_out", ("layer", "head", "pos", "d_model")),
    Buffer("attn_out", "attn_out", ("layer", "pos", "d_model")),
    Buffer("mlp_out", "mlp_out", ("layer", "pos", "d_model")),
)

#: What each axis name of :data:`BUFFERS` means: ``layer`` the captured layers L' (``layers=``),
#: ``stream`` the L+1 residual streams, ``pos``/``key`` the T token positions (queries/keys),
#: ``logit_pos`` the T - logits_from positions with logits, ``head``/``kv_head`` H/G, ``head_dim``
#: hd, ``d_model`` d, ``vocab`` V.
AXES = ("layer", "stream", "pos", "key", "logit_pos", "head", "kv_head", "head_dim", "d_model", "vocab")
#: The axes that count tokens: a padded row is cut to its real length along these.
TOKEN_AXES = ("pos", "key", "logit_pos")

#: Capture names of :meth:`sinklab.Model.run`, in the order of the table.
CAPTURES: Tuple[str, ...] = tuple(dict.fromkeys(b.capture for b in BUFFERS))
#: The three arrays of the "stats" capture (:class:`AttentionStats`' fields).
STATS: Tuple[str, ...] = tuple(b.name for b in BUFFERS if b.capture == "stats")
#: Per-layer activations captured inside the C forward (one Trace attribute each).
ACTIVATIONS: Tuple[str, ...] = CAPTURES[CAPTURES.index("q"):]
_BY_NAME = {b.name: b for b in BUFFERS}


def capture_of(buffer: str) -> str:
    """The capture name that fills ``buffer`` (the stats arrays belong to ``"stats"``)."""
    return _BY_NAME[buffer].capture


def buffer_shapes(config: Any, T: int, n_sel: int, logits_from: int,
                  logit_rows: Optional[int] = None) -> Dict[str, Tuple[int, ...]]:
    """Per-sequence shape of every buffer in :data:`BUFFERS` for ``T`` tokens, ``n_sel`` captured
    layers and logits from position ``logits_from`` (in [0, T)), or at ``logit_rows`` chosen
    positions; ``config`` a :class:`sinklab.families.config.ModelConfig`."""
    c = config
    rows = T - logits_from if logit_rows is None else int(logit_rows)
    size = {"layer": n_sel, "stream": c.n_layers + 1, "pos": T, "key": T, "logit_pos": rows,
            "head": c.n_heads, "kv_head": c.n_kv_heads, "head_dim": c.head_dim, "d_model": c.d_model,
            "vocab": c.vocab_size}
    return {b.name: tuple(size[a] for a in b.axes) for b in BUFFERS}


def buffer_axes(buffer: str) -> Tuple[str, ...]:
    """The axis names of ``buffer`` (per sequence, no batch axis); ``"ids"`` is ``("pos",)``."""
    return ("pos",) if buffer == "ids" else _BY_NAME[buffer].axes


_QUERY_SIDE = ("attn", "to_first", "entropy")   # their "pos" axis is the query's


def _labelled_axes(buffer: str) -> Tuple[str, ...]:
    """:func:`buffer_axes` with the token axis named as :meth:`Trace.to_xarray` names it."""
    pos = "query" if buffer in _QUERY_SIDE else "position"
    return tuple(pos if a == "pos" else a for a in buffer_axes(buffer))


def _shape(a: Optional[np.ndarray]) -> str:
    return "-" if a is None else f"{tuple(a.shape)} {a.dtype}"


def _layer_list(layers: List[int]) -> str:
    """``"0-29"`` for a contiguous run, else the first few indices."""
    if not layers:
        return "none"
    if list(layers) == list(range(layers[0], layers[-1] + 1)) and len(layers) > 2:
        return f"{layers[0]}-{layers[-1]}"
    head = ", ".join(str(l) for l in layers[:8])
    return f"[{head}{', ...' if len(layers) > 8 else ''}]"


# The array attributes of a Trace besides stats, in the order repr and save list them.
_ARRAYS = ("ids",) + tuple(c for c in CAPTURES if c != "stats") + ("lengths",)


@dataclass(repr=False)
class AttentionStats:
    """Attention statistics computed inside the C kernel, each (L', H, T) float32 for the
    captured layers (a leading B axis with batched ids):

    importance: Gu et al.'s a_k, the mean attention key k receives from queries i >= k.
    to_first: each query's attention to position 0, A[i, 0].
    entropy: each query's attention-row entropy in nats.
    """

    importance: np.ndarray
    to_first: np.ndarray
    entropy: np.ndarray

    def __repr__(self) -> str:
        return f"AttentionStats(importance, to_first, entropy: {_shape(self.importance)})"


@dataclass(repr=False)
class Trace:
    """Captured tensors of one run (a leading batch axis B when ids were (B, T)).

    Attributes:
        ids: (T,) or (B, T) int64, the tokens that were run.
        attn: (L', H, T, T) float32 attention probabilities of the captured layers ``layers``
            (rows sum to 1, zero above the diagonal), or None.
        resid: (L+1, T, d) float32 residual stream entering each layer; ``resid[L]`` is the last
            layer's output before the final norm. None if not captured.
        logits: (T - logits_from, V) float32 (or (R, V): the ``logits_at`` positions, in
            ``meta["logits_at"]``), or None.
        stats: :class:`AttentionStats` of the captured layers, or None.
        q: (L', H, T, hd) queries after RoPE, in Hugging Face's rotate-half layout, or None.
        k: (L', G, T, hd) keys after RoPE (same layout), one per kv head, or None.
        v: (L', G, T, hd) values, one per kv head, or None.
        z: (L', H, T, hd) each head's attention output before W_O (after interventions), or None.
        head_out: (L', H, T, d) each head's addition to the residual stream, or None.
        attn_out: (L', T, d) what the attention block adds to the residual stream, or None.
        mlp_out: (L', T, d) what the MLP adds to the residual stream, or None.
        layers: indices of the layers whose per-layer captures (all but resid and logits) are taken.
        lengths: (B,) int64 real lengths of a padded (B, T) batch (every capture is zero at
            positions >= lengths[b]), or None when every sequence has all T tokens.
        meta: model name/config, BOS token used (or None), and anything else a result should carry.
    """

    ids: np.ndarray
    attn: Optional[np.ndarray] = None
    resid: Optional[np.ndarray] = None
    logits: Optional[np.ndarray] = None
    stats: Optional[AttentionStats] = None
    layers: List[int] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)
    q: Optional[np.ndarray] = None
    k: Optional[np.ndarray] = None
    v: Optional[np.ndarray] = None
    z: Optional[np.ndarray] = None
    head_out: Optional[np.ndarray] = None
    attn_out: Optional[np.ndarray] = None
    mlp_out: Optional[np.ndarray] = None
    lengths: Optional[np.ndarray] = None
    decode: Optional[Callable[[Any], str]] = field(default=None, repr=False, compare=False)
    token_texts: Optional[List[Any]] = field(default=None, repr=False, compare=False)  # as saved, or None

    @property
    def tokens(self) -> Union[List[str], List[List[str]]]:
        """The text of each token of ``ids``: a list of T strings, or B lists for (B, T) ids (a
        padded row's pad positions included). Special tokens are written out (``"<bos>"``);
        a byte-level piece that does not complete a UTF-8 character reads U+FFFD.

        Raises:
            ValueError: the trace has no tokenizer (a model file without one, or a trace saved
                without it).
        """
        if self.token_texts is not None:
            return self.token_texts
        if self.decode is None:
            raise ValueError("this trace has no token texts: its model carries no tokenizer, and none were saved")
        rows = [[self.decode([int(i)]) for i in row] for row in np.atleast_2d(self.ids)]
        return rows[0] if self.ids.ndim == 1 else rows

    def to_xarray(self) -> Any:
        """Every captured array as one :class:`xarray.Dataset` with named dimensions and
        coordinates: ``layer`` (the captured layers' indices), ``stream`` (0..L), ``head``,
        ``kv_head``, ``head_dim``, ``d_model``, ``vocab``, and the token axes ``query`` and
        ``key`` (attention, ``to_first``, ``entropy``, ``importance``) or ``position`` (ids,
        residual streams and activations), ``logit_pos`` for logits; a leading ``batch`` for (B, T)
        ids. The token texts, where the model has a tokenizer, are the coordinates ``token``
        (along ``position``), ``query_token`` and ``key_token``. Needs xarray
        (``pip install 'sinklab[labels]'``).

        Example: ``tr.to_xarray().attn.sel(layer=3, head=0)`` is a (query, key) DataArray."""
        try:
            import xarray as xr
        except ImportError:
            raise ImportError("Trace.to_xarray needs xarray: pip install 'sinklab[labels]' (or pip install xarray)") \
                from None
        lead = ("batch",) if self.ids.ndim == 2 else ()
        data = {"ids": (lead + ("position",), self.ids)}
        arrays = {k: getattr(self, k) for k in _ARRAYS[1:] if k != "lengths" and getattr(self, k) is not None}
        if self.stats is not None:
            arrays.update(vars(self.stats))
        for name, a in arrays.items():
            data[name] = (lead + _labelled_axes(name), a)
        T = self.ids.shape[-1]
        coords: Dict[str, Any] = {"position": np.arange(T), "query": np.arange(T), "key": np.arange(T),
                                  "layer": np.asarray(self.layers, np.int64)}
        if self.logits is not None:
            at = self.meta.get("logits_at")
            coords["logit_pos"] = (np.arange(T - self.logits.shape[-2], T) if at is None
                                   else (lead + ("logit_pos",), np.asarray(at)))
        if self.resid is not None:
            coords["stream"] = np.arange(self.resid.shape[-3])
        if self.lengths is not None:
            data["lengths"] = (("batch",), self.lengths)
        if self.token_texts is not None or self.decode is not None:
            tok = np.asarray(self.tokens, dtype=object)
            for dim, name in (("position", "token"), ("query", "query_token"), ("key", "key_token")):
                coords[name] = (lead + (dim,), tok)
        meta = {k: v for k, v in self.meta.items() if isinstance(v, (str, int, float, bool))}
        return xr.Dataset(data, coords=coords, attrs=meta)

    def __repr__(self) -> str:
        """One line: what was captured (shape, dtype), the layers, the model and a few meta keys."""
        parts = [f"ids {_shape(self.ids)}"]
        parts += [f"{k} {_shape(getattr(self, k))}" for k in _ARRAYS[1:] if getattr(self, k) is not None]
        if self.stats is not None:
            parts.append(f"stats 3 x {_shape(self.stats.importance)}")
        parts.append(f"layers {_layer_list(self.layers)}")
        m = self.meta
        shown = [f"{k}={m[k]!r}" for k in ("bos_token_id", "starts_with_bos", "logits_from") if k in m]
        iv = m.get("intervention")
        if isinstance(iv, dict):
            shown.append("intervention=" + ("+".join(k for k, v in iv.items() if v) or "none"))
        rest = [k for k in m if k not in ("model", "source", "bos_token_id", "starts_with_bos",
                                          "logits_from", "intervention")]
        if rest:
            shown.append("more meta: " + ", ".join(rest[:6]) + (", ..." if len(rest) > 6 else ""))
        return f"<sinklab.Trace {m.get('model', '?')}: " + "; ".join(parts + shown) + ">"

    def save(self, path: Union[str, os.PathLike]) -> str:
        """Writes an .npz with every captured array and the metadata as JSON
        (:func:`sinklab.results.save_npz`, no pickle).

        The file is :func:`sinklab.results.npz_path` of ``path`` (``".npz"`` appended unless
        already there), the same file :meth:`load` reads for the same ``path``; returns that path.
        """
        arrays = {k: getattr(self, k) for k in _ARRAYS if getattr(self, k) is not None}
        if self.stats is not None:
            arrays.update({f"stats_{k}": v for k, v in vars(self.stats).items()})
        extra = {} if self.token_texts is None and self.decode is None else {"tokens": self.tokens}  # outlive the model
        return save_npz(path, arrays, {"layers": list(self.layers), "meta": self.meta, **extra})

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "Trace":
        """Reads what :meth:`save` wrote for the same ``path`` (``"tr"`` and ``"tr.npz"`` both
        name ``tr.npz``)."""
        arrays, m = load_npz(path)
        stats = None
        if "stats_importance" in arrays:
            stats = AttentionStats(*(arrays[f"stats_{k}"] for k in STATS))
        saved: Dict[str, Any] = {k: arrays.get(k) for k in _ARRAYS}
        return cls(stats=stats, layers=[int(x) for x in m["layers"]], meta=m["meta"], token_texts=m.get("tokens"),
                   **saved)
