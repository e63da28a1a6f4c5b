"""Interventions on the first token (position 0), applied inside the C forward.

Each is chosen per (layer, head); "query i" and "key k" are positions 0..T-1 of one sequence.

``mask_first``
    Queries i >= 1 may not attend to key 0: their scores are renormalised over keys 1..i.
    Query 0 has no other key and keeps its attention on itself. This does *not* force a head to
    mix information: on every head of every layer it is the same computation as running the
    sequence without its first token. Position 0 is then read by nobody, and with RoPE the
    scores depend only on position differences, so positions 1..T-1 compute exactly what
    positions 0..T-2 of the shortened run compute, up to float rounding (on SmolLM2-135M and
    128-token passages the logits of positions 1..T-1 agree with the no-⟨bos⟩ run within
    1.3e-4, 4e-6 of their largest magnitude). The sink simply moves to the first text token
    (its mean attention is then 0.39-0.42, as ⟨bos⟩'s was). On a subset of heads it only takes
    position 0 away from those heads.
``zero_first_value`` with ``zero_first_value_scope="others"`` (default)
    Queries i >= 1 take position 0's value vector v_0 as zero; query 0 keeps its own value.
    The attention probabilities of the intervened head are unchanged, so position 0 stays a
    sink, but whatever the head puts on it contributes nothing to the other positions: the
    paper's reading of the sink as an approximate no-op (its §3.2-3.3) made exact. Position
    0's own residual stream is bitwise that of the un-intervened run at every layer (the model
    is causal and its own attention output is untouched).
``zero_first_value`` with ``zero_first_value_scope="all"``
    Every query, query 0 included, takes v_0 as zero (the behaviour before the scope existed).
    Position 0 then also loses its own attention update, which changes its residual stream
    from the first intervened layer on. On SmolLM2-135M (128-token passages, all heads of
    layers 0-2 intervened) ⟨bos⟩'s residual norm entering layer 3 falls from 810 to 73 and the
    mean attention to position 0 over layers 3-29 from 0.41-0.48 to 0.015-0.025: the sink is
    removed, whereas scope "others" keeps it at 0.30-0.43. Use "all" to ablate the sink, not to
    test the no-op reading.
``zero_first_value`` with ``zero_first_value_scope="mean"``
    Queries i >= 1 read v_0 as the mean of the values of the other keys they see: for causal
    attention v'_0 = mean(v_1..v_i) for query i (with a window, only queries that still see
    key 0 are affected; with a fixed ⟨bos⟩ under intra-document masking, the mean is over the
    query's own document's keys; bidirectional: over keys 1..T-1). Query 0 keeps its own value,
    and the attention probabilities are unchanged, so position 0 stays a sink in place and its
    own residual stream is bitwise that of the un-intervened run, as with "others". What is
    removed is the sink's *content*: the weight A_i0 still lands somewhere, but it carries an
    average of what the query could read anyway instead of v_0, whereas "others" makes it carry
    nothing. The mean-ablation control: if the
    model is unchanged under "mean" but not under "others", v_0 matters only as a neutral
    place to park attention, not for what it holds.
``head_scale``
    The head's output (before W_O) is multiplied by a factor; 0 ablates the head.

Running without the ⟨bos⟩ token needs no intervention: tokenize with ``bos=False``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import numpy as np

Heads = Union[bool, Iterable[Tuple[int, int]], np.ndarray, None]


ZERO_FIRST_VALUE_SCOPES: Dict[str, int] = {"others": 1, "all": 2, "mean": 3}
"""``zero_first_value_scope`` names and the code the C core takes for them in the (L, H) array."""


@dataclass
class Intervention:
    """Which heads to intervene on, and how (see the module docstring for the exact meaning).

    Attributes:
        mask_first: queries i >= 1 of these heads may not attend to position 0 (query 0 is left
            alone). On all heads of all layers this equals running without the first token.
        zero_first_value: on these heads position 0's value vector counts as zero, for the
            queries chosen by ``zero_first_value_scope``.
        zero_first_value_scope: ``"others"`` (default): queries i >= 1 only, so position 0 stays
            a sink that contributes nothing to other tokens and its own stream is unchanged;
            ``"all"``: every query including 0, which also removes position 0's own update;
            ``"mean"``: queries i >= 1 read v_0 as the mean of the values of the other keys they
            see (causal: v_1..v_i), so the sink keeps its attention but passes on an average.
        head_scale: factor on each head's output before W_O; {(layer, head): factor} or a float
            array (L, H).

    Head sets (``mask_first``, ``zero_first_value``) are True (every head of every layer), an
    iterable of (layer, head) pairs, a boolean array (L, H), or None.
    """

    mask_first: Heads = None
    zero_first_value: Heads = None
    head_scale: Union[Dict[Tuple[int, int], float], np.ndarray, None] = field(default=None)
    zero_first_value_scope: str = "others"

    def __post_init__(self) -> None:
        _scope_code(self.zero_first_value_scope)
        for name in ("mask_first", "zero_first_value"):
            _check_heads(getattr(self, name), name)
        if not (self.head_scale is None or isinstance(self.head_scale, (dict, np.ndarray))):
            raise TypeError(f"head_scale must be None, a dict {{(layer, head): factor}} or an (L, H) array, "
                            f"got {type(self.head_scale).__name__}")

    def arrays(self, n_layers: int, n_heads: int) -> Dict[str, Optional[np.ndarray]]:
        """The C core's form, keys ``mask_first``, ``zero_first_value``, ``head_scale``.

        Returns uint8 (L, H) ``mask_first`` (0/1); uint8 (L, H) ``zero_first_value`` with 0 (none),
        1 (scope "others"), 2 (scope "all") or 3 (scope "mean"); float32 (L, H) ``head_scale``;
        each None if unused.
        """
        # the one Python check of every value (head pairs in range, array shapes, finite
        # factors, the scope); the C core re-checks codes and sizes as its safety net
        shape = (n_layers, n_heads)
        zero = _mask(self.zero_first_value, shape, "zero_first_value")
        if zero is not None:
            zero *= np.uint8(_scope_code(self.zero_first_value_scope))
        return {"mask_first": _mask(self.mask_first, shape, "mask_first"),
                "zero_first_value": zero,
                "head_scale": _scale(self.head_scale, shape)}


def core_arrays(intervene: Optional[Intervention], n_layers: int, n_heads: int) -> Dict[str, Any]:
    """:meth:`Intervention.arrays` of ``intervene``, or of no intervention when it is None: the
    keyword arguments (``mask_first``, ``zero_first_value``, ``head_scale``, each (L, H) or
    None) every C forward and derivative call takes."""
    return (intervene or Intervention()).arrays(n_layers, n_heads)


def _scope_code(scope: str) -> int:
    if not isinstance(scope, str) or scope not in ZERO_FIRST_VALUE_SCOPES:
        raise ValueError(f"zero_first_value_scope={scope!r}; expected one of "
                         f"{sorted(ZERO_FIRST_VALUE_SCOPES)} ('others': queries i >= 1 only, "
                         f"'all': every query including 0, 'mean': queries i >= 1 read v_0 as the "
                         f"mean of the other values they see)")
    return ZERO_FIRST_VALUE_SCOPES[scope]


def _check_heads(spec: Heads, name: str) -> None:
    """A TypeError unless ``spec`` is a head set: None, a bool, an (L, H) array or (layer, head) pairs."""
    if spec is None or isinstance(spec, (bool, np.bool_, np.ndarray)):
        return
    if isinstance(spec, (str, bytes)) or not hasattr(spec, "__iter__"):
        raise TypeError(f"{name} must be True/False (every head or none), an (L, H) boolean array or an iterable "
                        f"of (layer, head) pairs, got {spec!r}")
    for pair in (spec if isinstance(spec, (list, tuple, set, frozenset)) else ()):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise TypeError(f"{name}: each entry must be a (layer, head) pair of integers, got {pair!r}")


def _pairs(pairs, shape, name):
    for pair in pairs:
        l, h = (int(x) for x in pair)
        if not (0 <= l < shape[0] and 0 <= h < shape[1]):
            raise ValueError(f"{name}: (layer {l}, head {h}) outside a model with {shape[0]} layers x {shape[1]} heads")
        yield l, h


def _check_shape(spec: np.ndarray, shape: Tuple[int, int], name: str) -> None:
    if spec.shape != shape:
        raise ValueError(f"{name} has shape {spec.shape}, expected (layers, heads) = {shape}")


def _mask(spec: Heads, shape, name) -> Optional[np.ndarray]:
    if spec is None or spec is False:
        return None
    if spec is True:
        return np.ones(shape, np.uint8)
    if isinstance(spec, np.ndarray):
        _check_shape(spec, shape, name)
        return np.ascontiguousarray(spec.astype(bool), dtype=np.uint8)
    out = np.zeros(shape, np.uint8)
    for l, h in _pairs(spec, shape, name):
        out[l, h] = 1
    return out


def _scale(spec, shape) -> Optional[np.ndarray]:
    if spec is None:
        return None
    if isinstance(spec, np.ndarray):
        _check_shape(spec, shape, "head_scale")
        out = np.ascontiguousarray(spec, dtype=np.float32)
    else:
        out = np.ones(shape, np.float32)
        for (l, h), factor in zip(_pairs(spec.keys(), shape, "head_scale"), spec.values()):
            out[l, h] = factor
    if not np.all(np.isfinite(out)):
        raise ValueError("head_scale factors must be finite")
    return out
