"""User-defined analyses in a sweep: an ``analysis`` value ``"package.module:function"``.

The contract (that of the built-in analyses in :mod:`sinklab.sweeps.analyses`)::

    def my_analysis(task, model) -> (rows, arrays):
        # task.point: {"model", "prompts", "bos", "T", "intervention", "precision"} of this task
        #   (sinklab.sweeps.grid.read_prompts(task.point["prompts"]) gives the prompt texts)
        # task.rows: one {"eps": value} per row to report; task.settings: the spec's
        #   [settings."package.module:function"] table, any JSON-able keys
        # model: the worker's sinklab.Model (loaded once per worker)
        # rows: one dict of scalars per entry of task.rows, in that order
        # arrays: {name: NumPy array}, saved beside the rows
        ...

The function must be importable by name where the tasks run (on every worker of a cluster).
Its task key (the content address) holds the name and the sha256 of the function's source
code, so editing the function gives its tasks new keys and they run again, while the results
of the unchanged ones are kept. A worker that imports a different source than the one the
sweep was planned with fails that task with a message saying so, rather than storing results
under the wrong key. A function that raises fails its task alone, with the traceback kept in
``out/failed/``, as for the built-in analyses.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

USER_AXES = (("model", "prompts", "bos", "T", "intervention", "precision"), ("eps",))
"""(task axes, row axes) of every user analysis: those of ``sink_study``."""


def is_user_analysis(name: Any) -> bool:
    """Whether an ``analysis`` value names a user function (``"package.module:function"``)."""
    return isinstance(name, str) and ":" in name


def resolve(name: str) -> Callable[..., Any]:
    """The function ``"package.module:function"`` (``function`` may be dotted, e.g.
    ``Class.method``); ValueError naming what failed: the form, the import or the attribute."""
    mod_name, _, attr = name.partition(":")
    if not mod_name or not attr or ":" in attr:
        raise ValueError(f"analysis {name!r}: a user analysis is written 'package.module:function'")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as e:  # any import-time error of the user's module
        raise ValueError(f"analysis {name!r}: cannot import {mod_name!r} ({type(e).__name__}: {e})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"analysis {name!r}: {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"analysis {name!r}: {attr!r} is a {type(obj).__name__}, not a function")
    return obj


def source_sha256(name: str) -> str:
    """sha256 of the source code of the user analysis ``name`` (what its task keys hold)."""
    fn = resolve(name)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError) as e:
        raise ValueError(f"analysis {name!r}: its source code cannot be read ({e}), so its results could not be "
                         "told apart from an edited version's; define it in a .py file") from e
    return hashlib.sha256(src.encode("utf-8")).hexdigest()


def checked(name: str, planned_sha256: str) -> Callable[..., Any]:
    """The function ``name``, after checking that its source is the one the sweep was planned
    with (RuntimeError otherwise: the worker imports another version)."""
    now = source_sha256(name)
    if now != planned_sha256:
        raise RuntimeError(f"analysis {name!r}: this worker imports a different source (sha256 {now[:12]}) than "
                           f"the one the sweep was planned with ({planned_sha256[:12]}); install the same version "
                           "on every worker")
    fn = resolve(name)

    def run(task: Any, model: Any) -> Tuple[List[Dict[str, Any]], Dict[str, np.ndarray]]:
        return check_output(name, task, fn(task, model))

    return run


def check_output(name: str, task: Any, out: Any) -> Tuple[List[Dict[str, Any]], Dict[str, np.ndarray]]:
    """``out`` as (rows, arrays) after checking it keeps the contract; TypeError naming what
    does not (so the task fails with that message instead of storing something unreadable)."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(f"analysis {name!r} must return (rows, arrays), got {type(out).__name__}")
    rows, arrays = out
    if not isinstance(rows, list) or len(rows) != len(task.rows) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"analysis {name!r} must return a list of {len(task.rows)} dict(s) of scalars, one per "
                        f"row {task.rows}, got {rows!r:.200}")
    for r in rows:
        for k, v in r.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, (bool, int, float, str, np.generic))):
                raise TypeError(f"analysis {name!r}: row value {k!r} = {v!r:.80} is not a scalar")
    if not isinstance(arrays, dict):
        raise TypeError(f"analysis {name!r} must return a dict of arrays, got {type(arrays).__name__}")
    checked_arrays = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        if not isinstance(k, str) or a.dtype == object:
            raise TypeError(f"analysis {name!r}: array {k!r} must be a numeric NumPy array, got dtype {a.dtype}")
        checked_arrays[k] = a
    return rows, checked_arrays
