"""Running a grid: finished tasks skipped, the rest on Dask (or serially), one table at the end.

Failure model. A task's result appears only complete (:mod:`.store`). A worker process that
dies mid-task (killed, out of memory, node lost) loses only that task: the Dask scheduler
reruns it on another worker (up to ``distributed.scheduler.allowed-failures`` times, default 3),
and its marker in ``running/`` records the interrupted attempt. A task that raises is recorded
in ``failed/`` with its traceback and the sweep goes on with the others. A client that dies
loses nothing that finished: the next run of the same grid finds those results by their
content address and runs only the rest.
"""
from __future__ import annotations

import json
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from ..progress import progress_bar
from ..runtime import __version__, get_num_threads, set_num_threads
from ..system import write_atomic
from ..train.corpus import corpus_for, corpus_key
from . import analyses, cluster, store
from .grid import AXES, Grid, SpecError, Task, address_all, read_spec
from ..reprs import compact_repr

INFO_COLUMNS = ("seconds", "load_seconds", "host", "pid", "threads")
"""Table columns that say where and how fast a task ran (they differ between runs; the rest
of a row is a pure function of its task)."""


def execute(task: Task, out: str, threads: Optional[int] = None,
            slots: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """Runs one task and writes its result (called on a worker, or in-process when serial).

    Returns ``{"name", "seconds", "load_seconds", "host", "pid", "threads"}`` (``seconds``
    includes ``load_seconds``, the model's load when this worker had not loaded it); raises what the analysis raised,
    after recording it in ``failed/``.
    """
    n = cluster.task_threads(threads, slots)
    if slots is not None or _on_dask_worker():
        cluster.prepare_worker()
    before = get_num_threads()
    set_num_threads(n)
    mark = store.mark_running(out, task)
    t0 = time.perf_counter()
    try:
        load = 0.0
        if task.analysis == "train":
            rows, arrays = analyses.train(task, store.run_dir(out, task))
        else:
            model = analyses.worker_model(task.point["model"], task.point.get("precision", "fp32"))
            load = time.perf_counter() - t0
            rows, arrays = analyses.model_analysis(task)(task, model)
        info = {"seconds": time.perf_counter() - t0, "load_seconds": load, "host": socket.gethostname(),
                "pid": os.getpid(), "threads": n}
        store.write_result(out, task, rows, arrays, info)
        return {"name": task.name, **info}
    except Exception:  # Ctrl-C (KeyboardInterrupt) is no failure of the task: nothing recorded
        store.write_failure(out, task, traceback.format_exc())
        raise
    finally:
        os.remove(mark)
        set_num_threads(before)


def _on_dask_worker() -> bool:
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False


@compact_repr
@dataclass
class SweepResult:
    """What :func:`sweep` returns.

    Attributes:
        table: a pandas DataFrame, one row per grid point of every finished task (axes, metrics,
            ``key``/``name``/digests, and :data:`INFO_COLUMNS`); also ``out/table.parquet``.
        out: the results folder. ran / skipped / failed: task names run now, found finished,
            failed (see ``out/failed/``). interrupted: attempts lost with a dying worker (and
            rerun). figures: PNG paths. dashboard: the Dask dashboard's URL (None when serial).
        seconds: wall time. where: how the tasks ran, in words.
    """

    table: Any
    out: str
    ran: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)
    failed: Dict[str, str] = field(default_factory=dict)
    interrupted: List[str] = field(default_factory=list)
    figures: List[str] = field(default_factory=list)
    dashboard: Optional[str] = None
    seconds: float = 0.0
    where: str = ""

    def __str__(self) -> str:
        return (f"sweep: {len(self.ran)} task(s) run, {len(self.skipped)} already done, {len(self.failed)} failed, "
                f"{len(self.interrupted)} interrupted attempt(s) rerun; {len(self.table)} row(s) in "
                f"{os.path.join(self.out, 'table.parquet')} ({self.seconds:.1f} s, {self.where})")


def _grid_and_options(grid: Union[str, os.PathLike, Mapping[str, Any], Grid]) -> tuple:
    if isinstance(grid, Grid):
        return grid, {}
    spec = read_spec(os.fspath(grid)) if isinstance(grid, (str, os.PathLike)) else dict(grid)
    return Grid.from_spec(spec), {k: spec[k] for k in ("out", "scheduler", "workers", "threads") if k in spec}


def _prepare_corpora(tasks: List[Task]) -> None:
    """Fetches and tokenizes each training corpus once, here, before workers race for it."""
    seen = set()
    for t in tasks:
        if t.analysis != "train":
            continue
        cfg = {**t.settings, **t.point["train"]}
        k = corpus_key(cfg)
        if k not in seen:
            seen.add(k)
            corpus_for(cfg, quiet=False)


def _run_serial(tasks: List[Task], out: str, threads: Optional[int], progress: bool,
                failed: Dict[str, str]) -> List[str]:
    ran = []
    for t in progress_bar(tasks, progress=progress, desc="sweep (serial)", unit="task"):
        try:
            execute(t, out, threads)
            ran.append(t.name)
        except Exception as e:  # recorded in failed/; the other tasks go on
            failed[t.name] = f"{type(e).__name__}: {e}"
    return ran


def _run_dask(client: Any, tasks: List[Task], out: str, threads: Optional[int], progress: bool,
              failed: Dict[str, str]) -> List[str]:
    from distributed import as_completed

    slots = None if threads else cluster.host_slots(client)
    futures = {client.submit(execute, t, os.path.abspath(out), threads, slots, key=f"sinklab-{t.name}",
                             pure=False): t for t in tasks}
    ran = []
    bar = progress_bar(total=len(tasks), progress=progress, desc="sweep (dask)", unit="task")
    try:
        for fut in as_completed(futures):
            t = futures[fut]
            try:
                fut.result()
                ran.append(t.name)
            except Exception as e:  # the task raised, or killed its workers allowed-failures times
                failed[t.name] = f"{type(e).__name__}: {e}"
            bar.update(1)
    except KeyboardInterrupt:
        # on a cluster this sweep does not own, its queued tasks would run on after Ctrl-C
        try:
            client.cancel(list(futures))
        except Exception:  # the interrupt matters more than a failed cancel
            pass
        raise
    finally:
        bar.close()
    return ran


def _run_pending(pending: List[Task], out: str, serial: bool, client: Any, scheduler: Optional[str],
                 workers: Optional[int], threads: Optional[int], progress: bool, failed: Dict[str, str],
                 say: Any) -> tuple:
    """Runs the tasks in-process, on ``client``, on ``scheduler`` or on a new LocalCluster;
    returns (names run, dashboard URL, where in words)."""
    if serial:
        threads = threads or get_num_threads()
        return _run_serial(pending, out, threads, progress, failed), None, f"serial, {threads} thread(s)"
    own = client is None
    if own and scheduler:
        client, where = cluster.connect(scheduler), f"Dask scheduler {scheduler}"
    elif own:
        plan = cluster.plan_local([t.point.get("model", "") for t in pending], workers, threads)
        say(plan.describe())
        threads, where = plan.threads, plan.describe()
        client = cluster.start_local(plan)
    else:
        where = f"Dask client {client}"
    dashboard = client.dashboard_link
    say(f"Dask dashboard: {dashboard}")
    try:
        ran = _run_dask(client, pending, out, threads, progress, failed)
    except KeyboardInterrupt:
        if own and scheduler is None:  # our LocalCluster: kill its workers, do not wait for their tasks
            cluster.stop_local_now(client)
            store.clear_markers(out)  # the killed workers' (the sweep cleared older ones at its start)
        elif own:
            cluster.close_quietly(client)
        raise
    except BaseException:
        if own:
            cluster.close_quietly(client)
        raise
    if own:
        cluster.close_local(client)
    return ran, dashboard, where


def sweep(grid: Union[str, os.PathLike, Mapping[str, Any], Grid], out: Optional[str] = None,
          scheduler: Optional[str] = None, workers: Optional[int] = None, threads: Optional[int] = None,
          serial: bool = False, client: Any = None, progress: bool = True, figures: bool = True,
          verbose: bool = True) -> SweepResult:
    """Runs every task of a grid that is not finished yet and gathers all results in one table.

    Args:
        grid: a spec (dict, or a ``.toml`` / ``.json`` file; :mod:`sinklab.sweeps.grid`) or a Grid.
        out: results folder (default: the spec's ``out``, else ``"sweep-results"``).
        scheduler: address of a running Dask scheduler (``tcp://host:8786``) or a scheduler
            file; default the spec's ``scheduler``, else a new LocalCluster.
        workers, threads: LocalCluster worker processes and OpenMP threads per task (default
            :func:`sinklab.sweeps.cluster.plan_local`); on an existing cluster ``threads`` fixes
            the per-task threads.
        serial: run in this process, one task after another (no Dask needed).
        client: an existing ``distributed.Client`` to use (overrides ``scheduler``).
        progress: a tqdm bar over the tasks. figures: write ``out/figures/*.png``.
        verbose: print the plan, the dashboard link and the summary.

    Returns:
        :class:`SweepResult`. Raises :class:`SpecError` on a bad spec before anything runs.

    Ctrl-C raises KeyboardInterrupt (its message: the tasks finished and saved, and that a rerun
    runs the rest): a serial sweep stops inside the running task's C call; on its own
    LocalCluster the sweep kills the workers instead of waiting for their tasks. Finished
    results stay, half-written files and the in-flight markers are removed.
    """
    t0 = time.perf_counter()
    g, opts = _grid_and_options(grid)
    out = out or opts.get("out") or "sweep-results"
    scheduler = scheduler or opts.get("scheduler")
    workers = workers if workers is not None else opts.get("workers")
    threads = threads if threads is not None else opts.get("threads")
    say = print if verbose else (lambda *a, **k: None)
    for note in g.not_applicable():
        say(f"note: {note}")
    tasks = address_all(g.tasks(), __version__)
    store.ensure(out)
    stale = store.interrupted(out)           # markers of a client or node that died earlier
    store.clear_markers(out, stale)
    pending = [t for t in tasks if not store.is_done(out, t)]
    todo = {t.name for t in pending}
    done_before = [t.name for t in tasks if t.name not in todo]
    # largest models first (their tasks are the longest: fewer idle workers at the end), one
    # model's tasks together (a worker keeps its model)
    sizes = {m: cluster.model_bytes([m]) for m in {t.point["model"] for t in pending if "model" in t.point}}
    pending.sort(key=lambda t: (t.analysis != "train", -sizes.get(t.point.get("model"), 0),
                                t.point.get("model", ""), t.analysis))
    say(f"sweep: {len(tasks)} task(s), {len(done_before)} already done, {len(pending)} to run -> {os.path.abspath(out)}")
    failed: Dict[str, str] = {}
    ran, dashboard, where = [], None, "nothing to run"
    if pending:
        try:
            _prepare_corpora(pending)
            ran, dashboard, where = _run_pending(pending, out, serial, client, scheduler, workers, threads,
                                                 progress, failed, say)
        except KeyboardInterrupt as e:
            e.args = (_interrupted(out, tasks, e),)
            raise
    lost = store.interrupted(out)
    store.clear_markers(out, lost)
    store.clear_partial(out)
    result = SweepResult(table=None, out=out, ran=ran, skipped=done_before, failed=failed,
                         interrupted=stale + lost, dashboard=dashboard, where=where)
    result.table = table(out, tasks)
    if figures and len(result.table):
        # here, not at the top: a worker unpickling execute() would load matplotlib (1 s) to draw nothing
        from ..viz.figures_sweep import sweep_figures

        result.figures = sweep_figures(result.table, os.path.join(out, "figures"))
    result.seconds = time.perf_counter() - t0
    say(str(result))
    for name, err in failed.items():
        say(f"FAILED {name}: {err} (traceback in {os.path.join(out, 'failed', name + '.json')})")
    return result


def _interrupted(out: str, tasks: List[Task], e: KeyboardInterrupt) -> str:
    """After Ctrl-C: removes half-written files from ``out`` and says what a rerun will do."""
    store.clear_partial(out)
    done = sum(store.is_done(out, t) for t in tasks)
    said = f"{e.args[0]}; " if e.args and e.args[0] else ""
    return (f"{said}sweep interrupted: {done} of {len(tasks)} task(s) finished and saved in {os.path.abspath(out)}; "
            f"run the same sweep again to run the other {len(tasks) - done}")


def _need_pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("the sweep's table needs pandas and pyarrow: pip install 'sinklab[cluster]'") from None
    return pandas


def table(out: str, tasks: List[Task]) -> Any:
    """The rows of every finished task among ``tasks`` as one DataFrame, in task order, also
    written (atomically) to ``out/table.parquet``. Dict-valued cells (a training run's
    settings) are JSON strings."""
    pd = _need_pandas()
    rows = []
    for t in tasks:
        if not store.is_done(out, t):
            continue
        doc, _ = store.read_result(out, t)
        ident = doc["identity"]
        for r in doc["rows"]:
            rows.append({"analysis": t.analysis, **{k: (json.dumps(v, sort_keys=True) if isinstance(v, dict) else v)
                                                     for k, v in r.items()},
                         "name": t.name, "key": t.key, "model_sha256": ident.get("model_sha256"),
                         "prompts_sha256": ident.get("prompts_sha256"), "sinklab_version": ident.get("sinklab"),
                         **{k: doc["info"].get(k) for k in INFO_COLUMNS}})
    df = pd.DataFrame(rows)
    axes = [a for a in AXES if a in df]
    df = df[axes + [c for c in df.columns if c not in axes]]
    write_atomic(os.path.join(out, "table.parquet"), lambda f: df.to_parquet(f, index=False))
    return df


def task_arrays(out: str, task: Task) -> Dict[str, Any]:
    """The arrays a finished task saved (e.g. ``importance`` (P, L, H) of a sink study)."""
    return store.read_result(out, task)[1]


__all__ = ["sweep", "SweepResult", "execute", "table", "task_arrays", "SpecError", "INFO_COLUMNS"]
