"""A sweep's results folder: one result per task under its content address, written atomically.

Layout of ``out/``::

    tasks/ANALYSIS-<key>.json   the task's rows and identity (written last: its presence means done)
    tasks/ANALYSIS-<key>.npz    the arrays behind the rows (no pickle)
    running/<name>.<host>.<pid> a marker while a worker runs the task (left behind by a killed one)
    failed/<name>.json          the error of a task that raised (removed when it later succeeds)
    runs/<name>/                a training task's run folder (checkpoints; a retry resumes there)
    table.parquet               every row of every finished task of the grid (:func:`table`)
    figures/                    :mod:`sinklab.viz.figures_sweep`

Each file is written to a temporary name in the same folder, fsynced and renamed into place,
so a worker killed at any moment leaves either the whole result or none of it; a task run twice
(a retry after its worker died just after writing) writes the same name again.
"""
from __future__ import annotations

import json
import os
import socket
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..results import to_jsonable
from ..system import clean_stale, write_atomic, write_text_atomic
from .grid import Task

RESULT_FORMAT = "sinklab.sweeps.TaskResult/1"


def _dirs(out: str) -> Dict[str, str]:
    return {k: os.path.join(out, k) for k in ("tasks", "running", "failed", "runs", "figures")}


def ensure(out: str) -> None:
    for d in _dirs(out).values():
        os.makedirs(d, exist_ok=True)


def result_path(out: str, task: Task) -> str:
    return os.path.join(out, "tasks", task.name + ".json")


def run_dir(out: str, task: Task) -> str:
    return os.path.join(out, "runs", task.name)


def is_done(out: str, task: Task) -> bool:
    """True when the task's result exists and records this task's key (a partial or foreign
    file counts as not done, and is rewritten)."""
    try:
        with open(result_path(out, task), encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and d.get("format") == RESULT_FORMAT and d.get("key") == task.key


def write_result(out: str, task: Task, rows: List[Dict[str, Any]], arrays: Dict[str, np.ndarray],
                 info: Dict[str, Any]) -> str:
    """Writes the task's arrays, then its rows (the completion mark); returns the JSON path."""
    path = result_path(out, task)
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    write_atomic(path[:-5] + ".npz", lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # numpy's stub types **kwds badly
    doc = {"format": RESULT_FORMAT, "key": task.key, "name": task.name, "identity": task.identity,
           "rows": [{**task.point, **r, **m} for r, m in zip(task.rows, rows)], "info": info}
    _write_json(path, doc, sort_keys=True)
    failed = os.path.join(out, "failed", task.name + ".json")
    if os.path.exists(failed):
        os.remove(failed)
    return path


def write_failure(out: str, task: Task, error: str) -> None:
    doc = {"key": task.key, "name": task.name, "identity": task.identity, "error": error}
    _write_json(os.path.join(out, "failed", task.name + ".json"), doc)


def _write_json(path: str, doc: Dict[str, Any], sort_keys: bool = False) -> None:
    write_text_atomic(path, json.dumps(to_jsonable(doc), sort_keys=sort_keys, indent=1))


def read_result(out: str, task: Task) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
    """(the result JSON, its arrays) of a finished task."""
    path = result_path(out, task)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    with np.load(path[:-5] + ".npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return doc, arrays


# ------------------------------------------------------------------ in-flight markers
def marker(out: str, task: Task) -> str:
    return os.path.join(out, "running", f"{task.name}.{socket.gethostname()}.{os.getpid()}")


def mark_running(out: str, task: Task) -> str:
    path = marker(out, task)
    with open(path, "w", encoding="utf-8") as f:
        f.write(task.label() + "\n")
    return path


def interrupted(out: str) -> List[str]:
    """Marker names left by workers that died mid-task (their tasks were rerun elsewhere)."""
    d = os.path.join(out, "running")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def clear_markers(out: str, names: Optional[List[str]] = None) -> None:
    d = os.path.join(out, "running")
    for n in (names if names is not None else interrupted(out)):
        try:
            os.remove(os.path.join(d, n))
        except FileNotFoundError:
            pass


def clear_partial(out: str) -> List[str]:
    """Removes the temporary files a killed or interrupted writer left in ``tasks/`` and
    ``failed/`` (never a finished result), and the stale checkpoint temporaries of the training
    runs in ``runs/``; returns the paths removed. Two sweeps writing one folder at the same time
    are not supported."""
    removed = []
    for sub in ("tasks", "failed"):
        d = os.path.join(out, sub)
        for n in os.listdir(d) if os.path.isdir(d) else []:
            if ".tmp-" in n:
                try:
                    os.remove(os.path.join(d, n))
                    removed.append(os.path.join(d, n))
                except FileNotFoundError:
                    pass
    runs = os.path.join(out, "runs")
    for n in os.listdir(runs) if os.path.isdir(runs) else []:
        removed += clean_stale(os.path.join(runs, n))
    return removed
