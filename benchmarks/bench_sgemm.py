"""SGEMM speed: sinklab._core.sgemm_nt against NumPy (OpenBLAS) on SmolLM2-135M's linear layers.

    python benchmarks/bench_sgemm.py                 # T = 128, 512; 1 and 2 threads
    python benchmarks/bench_sgemm.py --threads 1 --T 128 --reps 9

C = A @ B.T with A (T, K) activations and B (N, K) weights, fp32. Both libraries write into a
preallocated C in the same process; each runs in blocks of calls, alternating over three rounds
so that slow drift of the machine hits both alike, and the median call time is reported as
GFLOP/s (2·M·N·K / time).

Each thread count runs in its own subprocess with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set,
since OpenBLAS reads its thread count at load time (threadpoolctl, when installed, is used to
confirm it and to name the OpenBLAS kernel). On machines where OPENBLAS_CORETYPE or
OPENBLAS_L2_SIZE are set, they pin OpenBLAS to an older kernel: to compare against NumPy as
shipped, unset both for the benchmark command only, e.g.
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_sgemm.py
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from machine import cpu_name

# SmolLM2-135M: d_model 576, d_ff 1536, vocab 49152. (N, K) of each weight.
SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
NAMES = {(576, 576): "q/o proj", (1536, 576): "gate/up", (576, 1536): "down", (49152, 576): "lm head"}


def child(threads: int, Ts: list[int], reps: int, seconds: float) -> None:
    """Runs in the subprocess: times every shape, prints one JSON line per result."""
    import numpy as np

    try:
        from sinklab import _core as core
    except ImportError:  # run from a checkout with the extension built in place
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from sinklab import _core as core

    core.set_num_threads(threads)
    blas = {}
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            blas = {k: info[0].get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
    except ImportError:
        pass
    print(json.dumps({"meta": True, "threads": threads, "simd": core.simd(), "blas": blas,
                      "numpy": np.__version__}), flush=True)
    rng = np.random.default_rng(0)
    for T in Ts:
        for N, K in SHAPES:
            A = rng.standard_normal((T, K), dtype=np.float32)
            B = rng.standard_normal((N, K), dtype=np.float32)
            Cs = np.empty((T, N), np.float32)
            Cn = np.empty((T, N), np.float32)
            run_sl = lambda: core.sgemm_nt(A, B, Cs)  # noqa: E731
            run_np = lambda: np.matmul(A, B.T, out=Cn)  # noqa: E731
            for f in (run_sl, run_np):  # warm up: page faults, thread start
                f()
                f()
            t0 = time.perf_counter()
            run_np()
            est = time.perf_counter() - t0
            n = max(reps, min(50, int(seconds / max(est, 1e-6))))
            ts_sl, ts_np = [], []
            # Alternate blocks of calls rather than single calls, and pause before each block: an
            # idle OpenBLAS worker keeps spinning for up to ~0.1 s after its call (OpenMP workers
            # for less), and a block timed inside that window runs at one-core speed.
            for _ in range(3):
                for f, ts in ((run_sl, ts_sl), (run_np, ts_np)):
                    time.sleep(0.3)
                    f()
                    for _ in range(-(-n // 3)):  # ceil: at least n calls in all
                        t0 = time.perf_counter()
                        f()
                        ts.append(time.perf_counter() - t0)
            scale = np.abs(Cn).max()
            err = float(np.abs(Cs - Cn).max() / scale) if scale > 0 else 0.0
            flop = 2.0 * T * N * K
            print(json.dumps({"T": T, "N": N, "K": K, "reps": len(ts_sl),
                              "sl": flop / statistics.median(ts_sl) / 1e9,
                              "np": flop / statistics.median(ts_np) / 1e9,
                              "sl_best": flop / min(ts_sl) / 1e9, "np_best": flop / min(ts_np) / 1e9,
                              "maxrel": err}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--T", type=int, nargs="+", default=[128, 512], help="rows of A (tokens)")
    ap.add_argument("--reps", type=int, default=7, help="least number of timed calls per shape")
    ap.add_argument("--seconds", type=float, default=1.0, help="aim for about this long per shape")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.T, args.reps, args.seconds)
        return

    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs)   Python {platform.python_version()}")
    if hasattr(os, "getloadavg"):  # other processes on the machine make 2-thread numbers erratic
        print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    pinned = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if pinned:
        print(f"note: {pinned} is set and pins OpenBLAS's kernel (see the docstring)")
    ratios = []
    for threads in args.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(threads), "--reps", str(args.reps),
               "--seconds", str(args.seconds), "--T", *map(str, args.T)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            r = json.loads(line)
            if r.get("meta"):
                blas = r["blas"] or {"note": "threadpoolctl not installed; OpenBLAS kernel unknown"}
                print(f"\n== {threads} thread(s): sinklab simd={r['simd']}, numpy {r['numpy']}, blas {blas}")
                print(f"{'':>29}{'--------- median ---------':>26}  {'---------- best ----------':>26}")
                print(f"{'T':>5} {'N':>6} {'K':>5}  {'layer':<9} {'sinklab':>8} {'numpy':>8} {'ratio':>6}"
                      f"  {'sinklab':>8} {'numpy':>8} {'ratio':>6}  {'max rel diff':>12}  reps")
                continue
            ratio = r["sl"] / r["np"]
            ratios.append(ratio)
            print(f"{r['T']:>5} {r['N']:>6} {r['K']:>5}  {NAMES[(r['N'], r['K'])]:<9} {r['sl']:>8.1f} "
                  f"{r['np']:>8.1f} {ratio:>6.2f}  {r['sl_best']:>8.1f} {r['np_best']:>8.1f} "
                  f"{r['sl_best'] / r['np_best']:>6.2f}  {r['maxrel']:>12.1e}  {r['reps']}")
        if proc.wait() != 0:
            sys.exit(f"benchmark child for {threads} thread(s) failed")
    if hasattr(os, "getloadavg"):
        print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())
    if ratios:
        print(f"GFLOP/s (median and best of the timed calls). Median ratio = sinklab / numpy: "
              f"min {min(ratios):.2f}, geometric mean {statistics.geometric_mean(ratios):.2f}")


if __name__ == "__main__":
    main()
