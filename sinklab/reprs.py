"""Compact representations of result objects, for Jupyter and the REPL.

A result holds arrays of thousands of numbers, nested results and long metadata; the default
dataclass repr prints all of it (a SinkStudy ran to ~4,000 characters, an OversquashingBound to
hundreds of lines). :func:`compact_repr` gives a result class a repr in the style of
``Trace``'s: one line, each field summarised (arrays by shape, dtype and range, containers by
length, nested results by their own compact form), e.g. for a sink study of SmolLM2 "importance
(144, 30, 9) float64 in [0.0011, 0.99]; T=64; bos=True; ...".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Type, TypeVar

import numpy as np

C = TypeVar("C", bound=Type[Any])

WIDTH = 60           # characters a scalar or string field may take before it is cut
NAME_FIELDS = ("model", "name")   # shown right after the class name, as Trace shows its model


def summarize(value: Any, depth: int = 0) -> str:
    """A short text for one field's ``value``: arrays by shape, dtype and range, containers by
    length (short ones in full), nested compact results by their repr (one level deep)."""
    if isinstance(value, np.ndarray):
        return _array(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if depth >= 1:
            return f"{type(value).__name__}(…)"
        return _inner(value, depth + 1)
    if isinstance(value, dict):
        text = _cut(repr(value)) if len(repr(value)) <= WIDTH else None
        if text is not None:
            return text
        keys = ", ".join(str(k) for k in list(value)[:4])
        return f"{{{len(value)} keys: {keys}{', …' if len(value) > 4 else ''}}}"
    if isinstance(value, (list, tuple)):
        text = repr(value)
        if len(text) <= WIDTH:
            return text
        kind = type(value[0]).__name__ if value else "?"
        return f"{type(value).__name__}[{len(value)}] of {kind}"
    return _cut(repr(value))


def _array(a: np.ndarray) -> str:
    text = f"{tuple(a.shape)} {a.dtype}"
    if a.size and (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        finite = a[np.isfinite(a)] if np.issubdtype(a.dtype, np.floating) else a
        if finite.size:
            text += f" in [{finite.min():.4g}, {finite.max():.4g}]"
        if finite.size < a.size:
            text += f", {a.size - finite.size} not finite"
    return text


def _cut(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


def _parts(obj: Any, depth: int, skip: Any = None) -> list:
    """``field summary`` for arrays, ``field=summary`` otherwise; None fields and ``skip`` left out."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not f.repr or value is None or (skip is not None and f.name in NAME_FIELDS and value == skip):
            continue
        text = summarize(value, depth)
        out.append(f"{f.name} {text}" if isinstance(value, np.ndarray) else f"{f.name}={text}")
    return out


def _inner(obj: Any, depth: int) -> str:
    """``Name(field summary, ...)``: a nested result, without the ``<sinklab. >`` wrapper."""
    return f"{type(obj).__name__}({', '.join(_parts(obj, depth))})"


def _repr(self: Any) -> str:
    head = next((getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name in NAME_FIELDS and isinstance(getattr(self, f.name), str)), None)
    return f"<sinklab.{type(self).__name__}{' ' + head if head else ''}: {'; '.join(_parts(self, 0, head))}>"


def compact_repr(cls: C) -> C:
    """Class decorator (put it above ``@dataclass``): replaces the generated repr by the compact
    one. Fields declared with ``field(repr=False)`` are left out; None fields are omitted."""
    cls.__repr__ = _repr  # type: ignore[assignment]
    cls.__compact_repr__ = True
    return cls


__all__ = ["compact_repr", "summarize"]
