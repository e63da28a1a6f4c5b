"""Saving and loading results without pickle: JSON-ready conversion, .npz with JSON metadata,
and JSON files tagged with a format name so a wrong file is refused with a clear error."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple, Union

import numpy as np

# re-exported: results were written through these before they moved to the ground floor
from .system import write_atomic, write_text_atomic  # noqa: F401


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    return x


def to_jsonable(x: Any) -> Any:
    """NumPy arrays/scalars -> lists/floats, NaN/inf -> None, recursively."""
    if isinstance(x, np.ndarray):
        return _nan_to_none(x.tolist())
    if isinstance(x, (np.floating,)):
        return _nan_to_none(float(x))
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    return _nan_to_none(x)


def save_json(path: Union[str, os.PathLike], obj: Any, indent: int = 1) -> str:
    """``obj`` as JSON (through :func:`to_jsonable`: NumPy values and NaN handled), written to a
    temporary file and renamed into place, so an interrupted write leaves no partial file."""
    text = json.dumps(to_jsonable(obj), indent=indent).encode("utf-8")
    return write_atomic(path, lambda f: f.write(text))


def npz_path(path: Union[str, os.PathLike]) -> str:
    """The file :func:`save_npz` writes and :func:`load_npz` reads for ``path``: ``path`` itself
    when it ends in ``.npz``, otherwise ``path + ".npz"`` (what ``np.savez`` does)."""
    p = os.fspath(path)
    return p if p.endswith(".npz") else p + ".npz"


def save_npz(path: Union[str, os.PathLike], arrays: Dict[str, np.ndarray], meta: Dict[str, Any]) -> str:
    """Arrays plus JSON metadata in one .npz (no pickle); returns the file written (:func:`npz_path`)."""
    out = {k: np.asarray(v) for k, v in arrays.items()}
    out["__meta__"] = np.frombuffer(json.dumps(to_jsonable(meta)).encode(), dtype=np.uint8)
    # atomic like save_json; np.savez writes the zip into the open temporary file
    return write_atomic(npz_path(path), lambda f: np.savez(f, **out))  # type: ignore[arg-type]


def load_npz(path: Union[str, os.PathLike]) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """(arrays, metadata) of a file written by :func:`save_npz` (``"x"`` and ``"x.npz"`` both name x.npz)."""
    with np.load(npz_path(path), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(bytes(z["__meta__"]).decode())
    return arrays, meta


def save_tagged_json(path: Union[str, os.PathLike], fmt: str, payload: Dict[str, Any]) -> None:
    """Writes ``{"format": fmt, **payload}`` as JSON, atomically (see :func:`save_json`)."""
    text = json.dumps({"format": fmt, **payload}).encode("utf-8")
    write_atomic(path, lambda f: f.write(text))


def load_tagged_json(path: Union[str, os.PathLike], fmt: str) -> Dict[str, Any]:
    """Reads a JSON file written by :func:`save_tagged_json`; ValueError unless its format is ``fmt``."""
    with open(os.fspath(path), encoding="utf-8") as f:
        d = json.load(f)
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise ValueError(f"{path} is not a saved {fmt.split('/')[0].split('.')[-1]}")
    return d
