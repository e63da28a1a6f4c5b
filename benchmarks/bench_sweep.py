#!/usr/bin/env python
"""Sweeps on Dask: a sink-study grid serial vs LocalCluster, the per-task overhead, and a 16-core node.

The grid (issue 12): ``sink_study`` over the 144 shipped passages (prompts ``sinks``) x ⟨bos⟩
[true, false] x every registered model (``sinklab.io.registry.MODELS``) at T = 64, eps 0.3 and
0.8 (eps is a row axis: one task per (model, bos), a row per eps), so 10 tasks with the 5 models.

Parts, all in one process, one after the other, each sweep into its own fresh folder (nothing
is skipped as already done):

1. serial: ``sweep(serial=True, threads=2)`` (the tasks one after another in this process, 2
   OpenMP threads each) against ``sweep(workers=2, threads=1)`` (a new LocalCluster: 2 worker
   processes x 1 OpenMP thread; its start is part of the wall time). Wall times, their ratio, and
   whether the two tables are equal outside ``sinklab.sweeps.INFO_COLUMNS`` (seconds, host, pid,
   threads), with the largest difference of a numeric column if not.
2. per-task overhead, measured two ways:
   (a) trivial tasks: a sink study of 1 prompt at T = 4..N (a few ms each) on the smallest
       selected model, on a LocalCluster of 2 workers x 1 thread started beforehand; run twice
       into fresh folders, the second timed (the model is then loaded on the workers). Reported:
       o = W x wall / n_tasks - mean in-task seconds (worker time per task spent outside the
       analysis: scheduling, transfer, result files, table), and wall / n_tasks.
   (b) the main cluster run: wall - sum(task seconds) / W (cluster start, imports, the idle tail
       of the last task, the table), a fixed cost plus n x the per-task part.
3. a 16-core node, two ways:
   (a) modelled (replay): the per-task durations measured in the cluster run (1 OpenMP thread,
       2 tasks at a time on 2 cores) plus o, placed by a greedy list schedule on 16 single-thread
       slots (a task to the first free slot), in the order the sweep submits them and
       longest-first (LPT); predicted wall = makespan + the fixed cost F measured here (cluster
       run wall - the same replay's makespan on its 2 slots). Also 8 slots fed the serial run's
       2-thread durations (8 workers x 2 threads). Not modelled: a 16-core node's own per-core
       speed and memory bandwidth with 16 tasks at once, and a model load per worker that
       takes a model for the first time (a measured task's seconds include the loads of the
       2 workers it ran on, not of 16).
   (b) measured (oversubscribed): a LocalCluster of 16 workers x 1 thread on this machine's
       cores, on a subset that fits in memory (the two smallest selected models; 16 workers
       x the largest model would not), its 144 passages split into --chunks prompt files so
       that there are more tasks than workers. Shows the scheduler drives 16 workers (every
       task done, how many worker processes ran one, table equal to a serial run of the same
       subset) and what 16 workers cost on 2 cores against 2 workers: oversubscription
       overhead, not a speed-up. Cluster starts are timed apart from the sweeps here.

Usage:
  python benchmarks/bench_sweep.py [--models NAME ...] [--n-prompts N] [--skip-sim]
      [--chunks 8] [--trivial-tasks 80] [--json OUT.json] [--keep]
  python benchmarks/bench_sweep.py --models smollm2-135m-instruct --n-prompts 4   # smoke test
The models are fetched into the sinklab cache if missing (~2 GB for all five). A Markdown block
for benchmarks/RESULTS.md is printed at the end, with the command line.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# run from a checkout without installing: the package sits one folder up
_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from machine import cpu_name, lscpu_lines  # noqa: E402

EPS = [0.3, 0.8]
T = 64
NODE_CORES = 16


# ------------------------------------------------------------------------------------ machine

def machine_info() -> Dict[str, Any]:
    import dask
    import distributed
    import pandas

    import sinklab
    from sinklab.model import available_memory
    from sinklab.sweeps import cluster

    free = available_memory()
    info = {"cpu": cpu_name(), "lscpu": lscpu_lines(), "logical_cpus": os.cpu_count(),
            "cores_usable": cluster.cores(), "free_gib": None if free is None else free / 2 ** 30,
            "python": platform.python_version(), "numpy": np.__version__, "pandas": pandas.__version__,
            "sinklab": sinklab.__version__, "sinklab_simd": sinklab.simd(), "dask": dask.__version__,
            "distributed": distributed.__version__}
    if hasattr(os, "getloadavg"):
        info["loadavg_before"] = os.getloadavg()
    return info


def print_machine(info: Dict[str, Any]) -> None:
    free = "unknown" if info["free_gib"] is None else f"{info['free_gib']:.1f} GiB"
    print(f"CPU: {info['cpu']}; {info['logical_cpus']} logical CPUs, {info['cores_usable']} usable by this process; "
          f"free memory {free}")
    for line in info["lscpu"]:
        print("  " + line)
    print(f"Python {info['python']}, NumPy {info['numpy']}, pandas {info['pandas']}, sinklab {info['sinklab']} "
          f"(kernels {info['sinklab_simd']}), dask {info['dask']}, distributed {info['distributed']}")
    if "loadavg_before" in info:
        print(f"load average before: {' '.join(f'{x:.2f}' for x in info['loadavg_before'])}")


# ------------------------------------------------------------------------------------ grids

def main_spec(models: Sequence[str], n_prompts: Optional[int]) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"analysis": "sink_study", "model": list(models), "prompts": "sinks",
                            "bos": [True, False], "T": T, "eps": EPS}
    if n_prompts:
        spec["settings"] = {"sink_study": {"n_prompts": int(n_prompts)}}
    return spec


def trivial_spec(model: str, n_tasks: int) -> Dict[str, Any]:
    """n_tasks tasks of a few ms: 1 prompt at T = 4, 5, ... with and without ⟨bos⟩."""
    return {"analysis": "sink_study", "model": model, "prompts": "sinks", "bos": [True, False],
            "T": list(range(4, 4 + max(1, n_tasks // 2))), "eps": [0.3],
            "settings": {"sink_study": {"n_prompts": 1}}}


def write_chunks(folder: str, n_prompts: Optional[int], chunks: int) -> List[str]:
    """The shipped passages (the first n_prompts) split into ``chunks`` prompt files, one a line."""
    from sinklab.prompts import load_passages

    texts = load_passages("sinks")[: n_prompts or None]
    os.makedirs(folder, exist_ok=True)
    paths = []
    for k, part in enumerate(np.array_split(np.arange(len(texts)), min(chunks, len(texts)))):
        path = os.path.join(folder, f"sinks-{k:02d}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(texts[i].strip() + "\n" for i in part)
        paths.append(path)
    return paths


def subset_spec(models: Sequence[str], chunk_files: Sequence[str]) -> Dict[str, Any]:
    return {"analysis": "sink_study", "model": list(models), "prompts": list(chunk_files),
            "bos": [True, False], "T": T, "eps": EPS}


# ------------------------------------------------------------------------------------ running

def timed_sweep(spec: Dict[str, Any], out: str, **kw: Any) -> Tuple[Any, float]:
    """(SweepResult, wall seconds of the sweep call) into a fresh folder; raises if anything failed."""
    from sinklab.sweeps import sweep

    if os.path.exists(out):
        raise RuntimeError(f"{out} exists: every sweep here goes into a fresh folder")
    t0 = time.perf_counter()
    res = sweep(spec, out=out, progress=False, figures=False, verbose=False, **kw)
    wall = time.perf_counter() - t0
    if res.failed or res.skipped:
        raise RuntimeError(f"sweep into {out}: {len(res.failed)} failed {dict(res.failed)}, "
                           f"{len(res.skipped)} skipped (expected none)")
    return res, wall


def start_cluster(n_tasks: int, models: Sequence[str], workers: int) -> Tuple[Any, float]:
    """A Client on a new LocalCluster of ``workers`` processes x 1 thread (the sweep's own
    start_local), and the seconds its start took."""
    from sinklab.sweeps import cluster

    t0 = time.perf_counter()
    client = cluster.start_local(cluster.plan_local(list(models) * max(1, n_tasks // max(1, len(models))), workers, 1))
    client.wait_for_workers(workers)
    return client, time.perf_counter() - t0


def stop_cluster(client: Any) -> None:
    cl = getattr(client, "cluster", None)
    client.close()
    if cl is not None:
        cl.close()


def comparable(df: Any) -> Any:
    from sinklab.sweeps import INFO_COLUMNS

    return df.drop(columns=[c for c in INFO_COLUMNS if c in df.columns]).reset_index(drop=True)


def tables_equal(a: Any, b: Any) -> Tuple[bool, float]:
    """(equal outside INFO_COLUMNS, the largest |difference| of a float column; 0 if equal)."""
    x, y = comparable(a), comparable(b)
    if list(x.columns) != list(y.columns) or len(x) != len(y):
        return False, float("inf")
    if x.equals(y):
        return True, 0.0
    diffs = [float(np.nanmax(np.abs(x[c].to_numpy(float) - y[c].to_numpy(float))))
             for c in x.columns if x[c].dtype.kind == "f"]
    return False, max(diffs, default=float("inf"))


def task_durations(df: Any) -> Any:
    """One row per task (the table has a row per eps): name, model, bos, seconds, pid; in table
    (grid) order."""
    return df.drop_duplicates("name")[["name", "analysis", "model", "bos", "seconds", "pid"]].reset_index(drop=True)


def submission_order(tasks: Any) -> List[float]:
    """Durations in the order the sweep submits them: grid order, stably sorted by (model, analysis)."""
    order = sorted(range(len(tasks)), key=lambda i: (tasks["model"][i], tasks["analysis"][i]))
    return [float(tasks["seconds"][i]) for i in order]


def list_schedule(durations: Sequence[float], slots: int) -> float:
    """Makespan (s) of a greedy list schedule: each task in turn to the slot that frees first."""
    free = [0.0] * max(1, slots)
    for d in durations:
        heapq.heappush(free, heapq.heappop(free) + d)
    return max(free)


# ------------------------------------------------------------------------------------ parts

def part_main(models: Sequence[str], n_prompts: Optional[int], root: str) -> Dict[str, Any]:
    spec = main_spec(models, n_prompts)
    print(f"\n== 1. main grid: {len(models)} model(s) x bos [true, false], T {T}, eps {EPS}, "
          f"{n_prompts or 'all'} prompt(s)", flush=True)
    ser, t_ser = timed_sweep(spec, os.path.join(root, "main-serial"), serial=True, threads=2)
    print(f"serial, 2 OpenMP threads: {len(ser.ran)} task(s) in {t_ser:.2f} s", flush=True)
    clu, t_clu = timed_sweep(spec, os.path.join(root, "main-cluster"), workers=2, threads=1)
    print(f"LocalCluster 2 workers x 1 thread (start included): {len(clu.ran)} task(s) in {t_clu:.2f} s", flush=True)
    same, diff = tables_equal(ser.table, clu.table)
    print(f"serial / cluster wall = {t_ser / t_clu:.3f}")
    print(f"tables identical: {same}" + ("" if same else f" (largest float difference {diff:.3g})"))
    d_ser, d_clu = task_durations(ser.table), task_durations(clu.table)
    print("per task (s):  model, bos: serial 2 threads | cluster 1 thread")
    for i in range(len(d_ser)):
        print(f"  {d_ser['model'][i]}, bos={d_ser['bos'][i]}: {d_ser['seconds'][i]:8.2f} | {d_clu['seconds'][i]:8.2f}")
    return {"n_tasks": len(ser.ran), "serial_s": t_ser, "cluster_s": t_clu, "identical": same, "max_diff": diff,
            "serial_tasks": d_ser, "cluster_tasks": d_clu, "serial_task_sum": float(d_ser["seconds"].sum()),
            "cluster_task_sum": float(d_clu["seconds"].sum()), "cluster_pids": int(d_clu["pid"].nunique())}


def part_trivial(client: Any, workers: int, model: str, n_tasks: int, root: str) -> Dict[str, Any]:
    spec = trivial_spec(model, n_tasks)
    timed_sweep(spec, os.path.join(root, "trivial-1"), client=client, threads=1)      # loads the model
    res, wall = timed_sweep(spec, os.path.join(root, "trivial-2"), client=client, threads=1)
    d = task_durations(res.table)
    n, mean_in = len(d), float(d["seconds"].mean())
    o = workers * wall / n - mean_in
    print(f"\n== 2a. per-task overhead: {n} trivial tasks ({model}, 1 prompt, T 4..{3 + n // 2}) on "
          f"{workers} workers x 1 thread, second run: wall {wall:.2f} s, wall/n {1e3 * wall / n:.1f} ms, "
          f"mean in-task {1e3 * mean_in:.1f} ms -> o = W x wall/n - in-task = {1e3 * o:.1f} ms per task", flush=True)
    return {"n_tasks": n, "wall_s": wall, "wall_per_task_s": wall / n, "mean_in_task_s": mean_in, "overhead_s": o}


def part_replay(main: Dict[str, Any], o: float) -> Dict[str, Any]:
    d1, d2 = main["cluster_tasks"], main["serial_tasks"]
    sub1 = [s + o for s in submission_order(d1)]
    lpt1 = sorted(sub1, reverse=True)
    fixed = main["cluster_s"] - list_schedule(sub1, 2)
    out = {"fixed_s": fixed, "overhead_s": o, "sum_1thread_s": float(d1["seconds"].sum())}
    for key, durs, slots in (("sub16", sub1, NODE_CORES), ("lpt16", lpt1, NODE_CORES),
                             ("lpt8x2", sorted([s + o for s in submission_order(d2)], reverse=True), NODE_CORES // 2)):
        span = list_schedule(durs, slots)
        out[key] = {"makespan_s": span, "predicted_s": span + fixed, "speedup_vs_serial": main["serial_s"] / (span + fixed),
                    "speedup_vs_1core": out["sum_1thread_s"] / (span + fixed)}
    longest = float(d1["seconds"].max())
    print(f"\n== 3a. 16-core node, modelled by replay of the measured per-task durations (+ o = {1e3 * o:.1f} ms):")
    print(f"  fixed cost F = cluster wall {main['cluster_s']:.2f} s - its 2-slot replay makespan "
          f"{main['cluster_s'] - fixed:.2f} s = {fixed:.2f} s (measured x modelled)")
    for key, what in (("sub16", "16 workers x 1 thread, submission order"),
                      ("lpt16", "16 workers x 1 thread, longest first  "),
                      ("lpt8x2", " 8 workers x 2 threads, longest first (serial run's 2-thread durations)")):
        r = out[key]
        print(f"  {what}: makespan {r['makespan_s']:.2f} s + F = {r['predicted_s']:.2f} s predicted, "
              f"{r['speedup_vs_serial']:.2f}x the measured serial run ({main['serial_s']:.2f} s on 2 cores), "
              f"{r['speedup_vs_1core']:.2f}x one core (sum of 1-thread task seconds / predicted)")
    print(f"  ({main['n_tasks']} tasks for {NODE_CORES} slots: the longest task, {longest:.2f} s at 1 thread, "
          f"bounds the 1-thread makespan; sum of 1-thread task seconds {out['sum_1thread_s']:.2f} s)")
    return out


def subset_grid(models: Sequence[str], n_prompts: Optional[int], chunks: int, root: str) -> Tuple[Dict[str, Any], List[str], int]:
    """The oversubscribed run's grid: the two smallest models, the passages in prompt files."""
    from sinklab.io import registry

    small = sorted(models, key=lambda m: registry.resolve_name(m).size)[:2]
    files = write_chunks(os.path.join(root, "chunks"), n_prompts, chunks)
    return subset_spec(small, files), small, len(small) * 2 * len(files)


def part_oversubscribed(spec: Dict[str, Any], small: Sequence[str], n: int, n_prompts: Optional[int], root: str,
                        two: Any, t_two: float, start2: float) -> Dict[str, Any]:
    """3b, after the 2-worker run of the same grid (``two``, ``t_two``): serial and 16 workers."""
    files = spec["prompts"]
    print(f"\n== 3b. oversubscribed: {', '.join(small)} x bos x {len(files)} prompt files "
          f"({n_prompts or 144} passages split) = {n} tasks", flush=True)
    print(f"  2 workers x 1 thread (start {start2:.2f} s, not included): {t_two:.2f} s", flush=True)
    ser, t_ser = timed_sweep(spec, os.path.join(root, "sub-serial"), serial=True, threads=2)
    print(f"  serial, 2 threads: {t_ser:.2f} s", flush=True)
    client16, start16 = start_cluster(n, small, NODE_CORES)
    try:
        six, t_six = timed_sweep(spec, os.path.join(root, "sub-16w"), client=client16, threads=1)
    finally:
        stop_cluster(client16)
    same16, diff16 = tables_equal(ser.table, six.table)
    same2, diff2 = tables_equal(ser.table, two.table)
    pids = int(task_durations(six.table)["pid"].nunique())
    print(f"  16 workers x 1 thread (start {start16:.2f} s, not included): {t_six:.2f} s; "
          f"{len(six.ran)}/{n} tasks done, {len(six.failed)} failed, run by {pids} worker process(es)")
    print(f"  16 workers / 2 workers wall = {t_six / t_two:.3f} (oversubscription overhead on "
          f"{os.cpu_count()} CPUs, not a speed-up)")
    print(f"  tables identical (16 workers vs serial): {same16}" + ("" if same16 else f" (largest {diff16:.3g})"))
    print(f"  tables identical (2 workers vs serial): {same2}" + ("" if same2 else f" (largest {diff2:.3g})"))
    return {"models": list(small), "n_tasks": n, "files": len(files), "serial_s": t_ser, "w2_s": t_two,
            "w2_start_s": start2, "w16_s": t_six, "w16_start_s": start16, "w16_done": len(six.ran),
            "w16_failed": len(six.failed), "w16_pids": pids, "identical16": same16, "identical2": same2,
            "w16_task_sum": float(task_durations(six.table)["seconds"].sum()),
            "w2_task_sum": float(task_durations(two.table)["seconds"].sum())}


# ------------------------------------------------------------------------------------ report

def markdown(cmd: str, info: Dict[str, Any], main: Dict[str, Any], triv: Dict[str, Any],
             rep: Dict[str, Any], sim: Optional[Dict[str, Any]]) -> str:
    flags = next((ln.split(":", 1)[1].strip() for ln in info["lscpu"] if ln.startswith("SIMD flags")), "")
    load = info.get("loadavg_before")
    over_b = main["cluster_s"] - main["cluster_task_sum"] / 2
    L = [f"```\n{cmd}\n```", "",
         f"{time.strftime('%Y-%m-%d %H:%M')}, {info['cores_usable']} cores usable, {info['free_gib'] or 0:.1f} GiB free"
         + (f", load average before {load[0]:.2f}" if load else "")
         + f"; `lscpu` model \"{info['cpu']}\", flags {flags}; sinklab {info['sinklab']} (kernels {info['sinklab_simd']}),"
         f" dask {info['dask']}, distributed {info['distributed']}.", "",
         "| run | tasks | workers x OpenMP threads | wall (s) | sum of task s | what it is |",
         "|---|---|---|---|---|---|",
         f"| serial | {main['n_tasks']} | 1 x 2 | {main['serial_s']:.2f} | {main['serial_task_sum']:.2f} | measured |",
         f"| LocalCluster | {main['n_tasks']} | 2 x 1 | {main['cluster_s']:.2f} | {main['cluster_task_sum']:.2f} | "
         f"measured, cluster start included; serial / cluster = **{main['serial_s'] / main['cluster_s']:.3f}**; "
         f"tables identical: **{main['identical']}** |",
         f"| per-task overhead, trivial tasks | {triv['n_tasks']} | 2 x 1 | {triv['wall_s']:.2f} | "
         f"{triv['mean_in_task_s'] * triv['n_tasks']:.2f} | measured: o = W x wall/n - in-task = "
         f"**{1e3 * triv['overhead_s']:.1f} ms** a task (wall/n {1e3 * triv['wall_per_task_s']:.1f} ms) |",
         f"| overhead of the main cluster run | {main['n_tasks']} | 2 x 1 | {main['cluster_s']:.2f} | "
         f"{main['cluster_task_sum']:.2f} | measured: wall - sum/W = **{over_b:.2f} s** (start, idle tail, table) |"]
    for key, what in (("sub16", "16 x 1, submission order"), ("lpt16", "16 x 1, longest first"),
                      ("lpt8x2", "8 x 2, longest first")):
        r = rep[key]
        L.append(f"| 16-core node, replay | {main['n_tasks']} | {what} | {r['predicted_s']:.2f} | - | modelled: "
                 f"makespan {r['makespan_s']:.2f} + F {rep['fixed_s']:.2f}; **{r['speedup_vs_serial']:.2f}x** the "
                 f"measured serial run, {r['speedup_vs_1core']:.2f}x one core |")
    if sim:
        L += [f"| oversubscribed subset, serial | {sim['n_tasks']} | 1 x 2 | {sim['serial_s']:.2f} | - | measured |",
              f"| oversubscribed subset | {sim['n_tasks']} | 2 x 1 | {sim['w2_s']:.2f} | {sim['w2_task_sum']:.2f} | "
              f"measured, start ({sim['w2_start_s']:.2f} s) excluded; tables identical: {sim['identical2']} |",
              f"| oversubscribed subset | {sim['n_tasks']} | 16 x 1 on {info['cores_usable']} cores | {sim['w16_s']:.2f} | "
              f"{sim['w16_task_sum']:.2f} | measured, start ({sim['w16_start_s']:.2f} s) excluded; "
              f"{sim['w16_done']}/{sim['n_tasks']} done by {sim['w16_pids']} workers; 16 / 2 workers = "
              f"**{sim['w16_s'] / sim['w2_s']:.3f}**; tables identical: **{sim['identical16']}** |"]
    L += ["", f"Replay: the {main['n_tasks']} per-task durations measured in the LocalCluster run (1 thread; the serial "
          "run's 2-thread ones for 8 x 2), each + o, on 16 (8) slots by a greedy list schedule; F = cluster wall - the "
          "same replay on its 2 slots. Not modelled: a 16-core node's per-core speed and memory bandwidth under 16 "
          "tasks, and model loads on 16 workers instead of 2."]
    if sim:
        L.append(f"Oversubscribed subset: {', '.join(sim['models'])} (the two smallest; 16 workers x the largest model "
                 f"would not fit in memory), the passages split into {sim['files']} prompt files so that there are "
                 f"more tasks than workers.")
    return "\n".join(L)


def to_json(x: Any) -> Any:
    if hasattr(x, "to_dict"):
        return x.to_dict(orient="records")
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=None, help="registered models (default: all)")
    ap.add_argument("--n-prompts", type=int, default=0, help="first N passages only (default: all 144)")
    ap.add_argument("--skip-sim", action="store_true", help="no oversubscribed 16-worker run (part 3b)")
    ap.add_argument("--chunks", type=int, default=8, help="prompt files the passages are split into in 3b")
    ap.add_argument("--trivial-tasks", type=int, default=80, help="tasks of the per-task overhead sweep (2a)")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", action="store_true", help="keep the results folders (printed)")
    args = ap.parse_args()

    from sinklab.io import registry

    models = args.models or list(registry.MODELS)
    unknown = [m for m in models if not registry.is_registered(m)]
    if unknown:
        ap.error(f"not registered: {unknown}; choose from {', '.join(registry.MODELS)}")
    models = [registry.resolve_name(m).name for m in models]
    n_prompts = args.n_prompts or None
    cmd = "python benchmarks/bench_sweep.py" + "".join(f" {a}" for a in sys.argv[1:])
    info = machine_info()
    print_machine(info)
    for m in models:                       # fetch before timing (a no-op when cached)
        registry.fetch(m, quiet=True)
    root = tempfile.mkdtemp(prefix="bench_sweep-")
    try:
        main_r = part_main(models, n_prompts, root)
        smallest = "smollm2-135m-instruct" if "smollm2-135m-instruct" in models else \
            min(models, key=lambda m: registry.resolve_name(m).size)
        client2, start2 = start_cluster(args.trivial_tasks, [smallest], 2)
        try:
            if not args.skip_sim:      # on fresh workers, as the 16 of 3b will be
                sub, small, n_sub = subset_grid(models, n_prompts, args.chunks, root)
                two, t_two = timed_sweep(sub, os.path.join(root, "sub-2w"), client=client2, threads=1)
            triv = part_trivial(client2, 2, smallest, args.trivial_tasks, root)
        finally:
            stop_cluster(client2)
        print(f"\n== 2b. main cluster run: wall {main_r['cluster_s']:.2f} s - sum(task s) / 2 "
              f"{main_r['cluster_task_sum'] / 2:.2f} s = {main_r['cluster_s'] - main_r['cluster_task_sum'] / 2:.2f} s "
              f"(cluster start, idle tail, table; ~{main_r['n_tasks']} x o = {main_r['n_tasks'] * triv['overhead_s']:.2f} s "
              f"of it per-task)")
        rep = part_replay(main_r, triv["overhead_s"])
        sim = None if args.skip_sim else part_oversubscribed(sub, small, n_sub, n_prompts, root, two, t_two, start2)
        if hasattr(os, "getloadavg"):
            print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print("\n== Markdown for benchmarks/RESULTS.md\n")
        print(markdown(cmd, info, main_r, triv, rep, sim))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(to_json({"command": cmd, "machine": info, "main": main_r, "trivial": triv, "replay": rep,
                                   "oversubscribed": sim}), f, indent=1)
    finally:
        if args.keep:
            print(f"results kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
