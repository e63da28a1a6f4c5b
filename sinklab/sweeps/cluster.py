"""Where a sweep's tasks run: in this process, on a local Dask cluster, or on an existing one.

Sizing a :class:`dask.distributed.LocalCluster` (the default): every worker is a separate
process with one Dask thread, so it runs one task at a time, and each task uses
``threads`` OpenMP threads, with ``workers x threads <= cores`` (cores: the CPUs this process
may run on, ``os.sched_getaffinity``). Workers default to the fewest of

* the cores;
* the tasks;
* the grid's work in units of its largest task, ceil(sum of the tasks' model sizes / the largest
  one): with one model much larger than the rest, fewer workers with more threads each finish
  its tasks sooner, where one thread each would leave them running long after the others (on
  the 5 registered models, 8 x 2 instead of 10 x 1 on 16 cores predicts 123 s instead of 257 s:
  benchmarks/RESULTS.md);
* what the free memory holds at about twice the largest model file plus 1 GiB each;

and threads to ``cores // workers``. Oversubscribing (more OpenMP threads than cores) costs far
more than it gains on a shared node: a team stalls whenever one of its threads is descheduled.

On an existing cluster (``scheduler=ADDRESS``, e.g. one started by dask-jobqueue), a task
uses ``cores // (Dask threads of all workers on its host)`` OpenMP threads, counted when the
sweep starts, unless ``threads`` is given.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ..io import registry
from ..system import available_memory

GIB = 1 << 30


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                          # macOS, Windows
        return os.cpu_count() or 1


@dataclass
class LocalPlan:
    workers: int
    threads: int
    cores: int
    free_bytes: Optional[int]
    per_worker_bytes: int

    def describe(self) -> str:
        mem = "" if self.free_bytes is None else \
            f"; {self.free_bytes / GIB:.1f} GiB free, ~{self.per_worker_bytes / GIB:.1f} GiB a worker"
        return (f"LocalCluster: {self.workers} worker process(es) x {self.threads} OpenMP thread(s) "
                f"on {self.cores} core(s){mem}")


def model_bytes(models: Sequence[str]) -> int:
    """The largest size on disk among the models (registered size for a name not yet fetched)."""
    biggest = 0
    for m in models:
        if os.path.isfile(m):
            biggest = max(biggest, os.path.getsize(m))
        elif os.path.isdir(m):
            biggest = max(biggest, sum(os.path.getsize(os.path.join(m, f)) for f in os.listdir(m)
                                       if os.path.isfile(os.path.join(m, f))))
        elif registry.is_registered(m):
            biggest = max(biggest, registry.resolve_name(m).size)
    return biggest


def plan_local(task_models: Sequence[str], workers: Optional[int] = None,
               threads: Optional[int] = None) -> LocalPlan:
    """Workers and OpenMP threads for a LocalCluster (see the module docstring).

    Args:
        task_models: the model of every task to run (repeats included; "" for a training run).
        workers, threads: fixed by the caller when not None.
    """
    n_cores = cores()
    sizes = {m: model_bytes([m]) if m else 0 for m in set(task_models)}
    largest = max(sizes.values(), default=0)
    per_worker = 2 * largest + GIB
    free = available_memory()
    if workers is None:
        fit = n_cores if threads is None else max(1, n_cores // threads)
        by_mem = n_cores if free is None else max(1, free // per_worker)
        by_work = len(task_models) if largest == 0 else -(-sum(sizes[m] for m in task_models) // largest)
        workers = max(1, min(fit, max(1, len(task_models)), by_work, by_mem))
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if threads is None:
        threads = max(1, n_cores // workers)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return LocalPlan(int(workers), int(threads), n_cores, free, per_worker)


def _need_distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise ImportError("sweeps on Dask need the cluster extra: pip install 'sinklab[cluster]' "
                          "(or run serially with serial=True / --serial)") from None
    return distributed


def start_local(plan: LocalPlan) -> Any:
    """A Client on a new LocalCluster of ``plan.workers`` processes with one Dask thread each."""
    distributed = _need_distributed()
    cluster = distributed.LocalCluster(n_workers=plan.workers, threads_per_worker=1, processes=True,
                                       silence_logs=logging.ERROR, dashboard_address=":0")
    return distributed.Client(cluster)


def close_local(client: Any) -> None:
    """Closes a Client of :func:`start_local` and its LocalCluster (waiting for running tasks)."""
    local = getattr(client, "cluster", None)
    client.close()
    if local is not None:
        local.close()


def prepare_worker() -> None:
    """Called at the start of each task on a Dask worker: gives tqdm a thread lock before its
    first bar. tqdm otherwise creates a multiprocessing lock, a named semaphore registered with
    the client's resource tracker, which a worker killed on Ctrl-C (:func:`stop_local_now`)
    never unregisters ("leaked semaphore objects" at exit). A worker runs one task at a time in
    its own process: a lock across processes has nothing to guard."""
    import threading

    from tqdm import tqdm

    if getattr(tqdm, "_lock", None) is None:
        tqdm.set_lock(threading.RLock())


def stop_local_now(client: Any, timeout: float = 1.0) -> List[int]:
    """Ctrl-C: kills the worker processes of a :func:`start_local` cluster at once and closes
    client and cluster with ``timeout``-second waits; returns the killed pids.

    A graceful close waits for the running tasks (about 4 s with two workers inside a C call,
    benchmarks/bench_interrupt.py). Killing loses only those tasks: their results were never
    written (a result appears whole or not at all, :mod:`.store`), so a rerun runs them again.
    The nannies are told not to restart their workers first: a nanny whose worker dies restarts
    it unless it is closing gracefully, and the cluster's close then waits for the new worker
    to start (0.7 s of a 1.1 s exit, measured)."""
    local = getattr(client, "cluster", None)
    kill = getattr(signal, "SIGKILL", signal.SIGTERM)
    pids = []
    for nanny in list(getattr(local, "workers", {}).values()):
        if hasattr(nanny, "close_gracefully"):  # distributed >= 2022: no restart, and it closes itself
            nanny.close_gracefully(reason="sinklab-ctrl-c")
        elif hasattr(nanny, "auto_restart"):
            nanny.auto_restart = False
        pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
        if pid:
            try:
                os.kill(pid, kill)
                pids.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    # the scheduler logs the futures it can no longer gather from the killed workers: expected here
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        close_quietly(client, timeout)  # a timeout while closing: the processes are gone already
    finally:
        quiet.setLevel(level)
    return pids


def close_quietly(client: Any, timeout: float = 5.0) -> None:
    """Closes a client and its LocalCluster (if it has one) with ``timeout``-second waits,
    ignoring their errors: for paths where another error (or Ctrl-C) is already propagating."""
    for closing in (client, getattr(client, "cluster", None)):
        try:
            if closing is not None:
                closing.close(timeout=timeout)
        except Exception:  # already failing: the original error matters
            pass


def connect(address: str) -> Any:
    """A Client on an existing scheduler (``tcp://host:8786``, or a scheduler file's path)."""
    distributed = _need_distributed()
    if os.path.isfile(address):
        return distributed.Client(scheduler_file=address)
    return distributed.Client(address)


def host_slots(client: Any) -> Dict[str, int]:
    """{host: Dask threads of all workers on it}, from the scheduler."""
    slots: Dict[str, int] = {}
    for w in client.scheduler_info(n_workers=-1)["workers"].values():
        host = w.get("host") or w["address"].split("://")[-1].rsplit(":", 1)[0]
        slots[host] = slots.get(host, 0) + int(w.get("nthreads", 1))
    return slots


def task_threads(threads: Optional[int], slots: Optional[Dict[str, int]]) -> int:
    """The OpenMP threads a task uses where it runs (called on the worker)."""
    if threads:
        return int(threads)
    if not slots:
        return cores()
    try:
        from distributed import get_worker

        host = get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    except (ImportError, ValueError):
        host = socket.gethostname()
    return max(1, cores() // max(1, slots.get(host, 1)))
