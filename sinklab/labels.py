"""Results as labelled tables: the ``to_frame()`` methods build pandas DataFrames here.

Each table is long (one row per cell of the result's arrays): one column per axis (``prompt``,
``layer``, ``head``, ``stream``, ``position``, ...) holding the index, then one column per
quantity, so ``df.groupby("layer").a0.mean()`` or a seaborn plot needs no reshaping (write
``df["head"]``: ``df.head`` is DataFrame's own method). pandas is an optional dependency
(``pip install 'sinklab[labels]'``).
"""
from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np


def pandas() -> Any:
    """The pandas module, or an ImportError that says how to install it."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_frame() needs pandas: pip install 'sinklab[labels]' (or pip install pandas)") from None
    return pd


def long_frame(columns: Dict[str, np.ndarray], dims: Sequence[str], **constant: Any) -> Any:
    """A DataFrame with one row per cell of the equally shaped ``columns``: a column per axis in
    ``dims`` (the cell's index along it), then the ``columns``' values, then ``constant`` ones.

    Raises:
        ValueError: the arrays' shapes differ or do not have ``len(dims)`` axes."""
    pd = pandas()
    shapes = {k: np.shape(v) for k, v in columns.items()}
    shape = next(iter(shapes.values()))
    if any(s != shape for s in shapes.values()) or len(shape) != len(dims):
        raise ValueError(f"long_frame: shapes {shapes} do not all match the axes {tuple(dims)}")
    index = np.indices(shape).reshape(len(shape), -1)
    data: Dict[str, Any] = {d: index[i] for i, d in enumerate(dims)}
    data.update({k: np.asarray(v).reshape(-1) for k, v in columns.items()})
    data.update(constant)
    return pd.DataFrame(data)


def concat(frames: Dict[str, Any], key: str) -> Any:
    """The frames one under another, with a first column ``key`` naming each one's source."""
    pd = pandas()
    parts = [f.assign(**{key: name})[[key] + list(f.columns)] for name, f in frames.items()]
    return pd.concat(parts, ignore_index=True)


__all__ = ["long_frame", "concat", "pandas"]
