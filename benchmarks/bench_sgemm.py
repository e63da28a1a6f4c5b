"""SGEMM speed: sinklab._core.sgemm against NumPy (OpenBLAS) on SmolLM2-135M's linear layers,
forward and backward.

    python benchmarks/bench_sgemm.py                 # all rows; 1 and 2 threads
    python benchmarks/bench_sgemm.py --threads 1 --layouts NN TN --T-bwd 512 --reps 9

Layouts, for a weight W stored (out, in) and T rows (tokens, or a batch of cotangents):
    NT  forward        y  = x @ W.T    M = T,   N = out, K = in    (A (T, in),  B = W (out, in))
    NN  input grad     dx = dy @ W     M = T,   N = in,  K = out   (A (T, out), B = W (out, in))
    TN  weight grad    dW = dy.T @ x   M = out, N = in,  K = T     (A (T, out), B = x (T, in))
NT runs for T in --T; NN for T in --T-bwd (512 tokens, and 64*576 = 36864 rows for a batch of
64 cotangents of a 576-wide residual); TN for K = T = 512. For NN and TN rows, sinklab's NT on the
same (M, N, K) (operands copied to the NT layout) is timed too: "vs NT" = layout / NT speed, the
cost of the layout itself.

Both libraries write into a preallocated C in the same process; each runs in blocks of calls,
alternating over three rounds so that slow drift of the machine hits all alike, and the median call
time is reported as GFLOP/s (2·M·N·K / time).

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
import shutil
import statistics
import subprocess
import sys
import time

from machine import cpu_name

# SmolLM2-135M: d_model 576, q dim 576, k/v dim 192, d_ff 1536, vocab 49152. (out, in) of each weight.
WEIGHTS = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
NAMES = {(576, 576): "q/o proj", (192, 576): "k/v proj", (1536, 576): "gate/up", (576, 1536): "down",
         (49152, 576): "lm head"}
FORWARD = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]  # NT rows, as before
BIG = 10_000  # rows above this: batched cotangents; the lm head is not run there


def cases(layouts: list[str], Ts: list[int], Ts_bwd: list[int], Ks_tn: list[int]):
    """(layout, M, N, K, weight name) of every row."""
    out = []
    if "NT" in layouts:
        out += [("NT", T, o, i, NAMES[(o, i)]) for T in Ts for o, i in FORWARD]
    if "NN" in layouts:
        out += [("NN", T, i, o, NAMES[(o, i)]) for T in Ts_bwd for o, i in WEIGHTS if T < BIG or o < BIG]
    if "TN" in layouts:
        out += [("TN", o, i, T, NAMES[(o, i)]) for T in Ks_tn for o, i in WEIGHTS]
    return out


def child(threads: int, rows: list, reps: int, seconds: float) -> None:
    """Runs in the subprocess: times every case, prints one JSON line per result."""
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
    for layout, M, N, K, name in rows:
        ta, tb = layout[0] == "T", layout[1] == "T"
        A = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        B = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        opA, opB = (A.T if ta else A), (B.T if tb else B)  # numpy views: (M, K), (K, N)
        Cs, Cn = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
        funcs = {
            "sl": lambda: core.sgemm(A, B, Cs, trans_a=ta, trans_b=tb),
            "np": lambda: np.matmul(opA, opB, out=Cn),
        }
        if layout != "NT":  # the same product in the NT layout: what the layout itself costs
            A_nt, B_nt = np.ascontiguousarray(opA), np.ascontiguousarray(opB.T)
            Ct = np.empty((M, N), np.float32)
            funcs["nt"] = lambda: core.sgemm(A_nt, B_nt, Ct)
        for f in funcs.values():  # warm up: page faults, thread start
            f()
            f()
        t0 = time.perf_counter()
        funcs["np"]()
        est = time.perf_counter() - t0
        n = max(reps if est < 0.1 else 3, min(50, int(seconds / max(est, 1e-6))))
        ts = {k: [] for k in funcs}
        # Alternate blocks of calls rather than single calls, and pause before each block: an
        # idle OpenBLAS worker keeps spinning for up to ~0.1 s after its call (OpenMP workers
        # for less), and a block timed inside that window runs at one-core speed.
        for _ in range(3):
            for k, f in funcs.items():
                time.sleep(0.3)
                f()
                for _ in range(-(-n // 3)):  # ceil: at least n calls in all
                    t0 = time.perf_counter()
                    f()
                    ts[k].append(time.perf_counter() - t0)
        scale = np.abs(Cn).max()
        err = float(np.abs(Cs - Cn).max() / scale) if scale > 0 else 0.0
        flop = 2.0 * M * N * K
        r = {"layout": layout, "M": M, "N": N, "K": K, "name": name, "reps": len(ts["sl"]), "maxrel": err}
        for k, t in ts.items():
            r[k] = flop / statistics.median(t) / 1e9
            r[k + "_best"] = flop / min(t) / 1e9
        print(json.dumps(r), flush=True)


def machine_lines() -> list[str]:
    """lscpu's lines on the CPU model, cores and caches (empty where lscpu is missing)."""
    if not shutil.which("lscpu"):
        return []
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keys = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per", "Socket(s)", "L1d", "L2", "L3")
    return [ln.strip() for ln in out.splitlines() if ln.strip().startswith(keys)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layouts", nargs="+", default=["NT", "NN", "TN"], choices=["NT", "NN", "TN"])
    ap.add_argument("--T", type=int, nargs="+", default=[128, 512], help="rows of the forward (NT) rows")
    ap.add_argument("--T-bwd", type=int, nargs="+", default=[512, 64 * 576], help="rows of the NN rows")
    ap.add_argument("--K-tn", type=int, nargs="+", default=[512], help="K = tokens of the TN rows")
    ap.add_argument("--reps", type=int, default=7, help="least number of timed calls per case (3 for slow ones)")
    ap.add_argument("--seconds", type=float, default=1.0, help="aim for about this long per case and library")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, json.loads(args.rows), args.reps, args.seconds)
        return

    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs)   Python {platform.python_version()}")
    for line in machine_lines():
        print("  " + line)
    if hasattr(os, "getloadavg"):  # other processes on the machine make 2-thread numbers erratic
        print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    pinned = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if pinned:
        print(f"note: {pinned} is set and pins OpenBLAS's kernel (see the docstring)")
    rows = cases(args.layouts, args.T, args.T_bwd, args.K_tn)
    ratios: dict[str, list[float]] = {}
    vs_nt: dict[str, list[float]] = {}
    for threads in args.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(threads), "--reps", str(args.reps),
               "--seconds", str(args.seconds), "--rows", json.dumps(rows)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            r = json.loads(line)
            if r.get("meta"):
                blas = r["blas"] or {"note": "threadpoolctl not installed; OpenBLAS kernel unknown"}
                print(f"\n== {threads} thread(s): sinklab simd={r['simd']}, numpy {r['numpy']}, blas {blas}")
                print(f"{'':>37}{'--------- median ---------':>26}  {'---------- best ----------':>26}")
                print(f"{'op':<3} {'M':>6} {'N':>6} {'K':>6}  {'layer':<9} {'sinklab':>8} {'numpy':>8} {'ratio':>6}"
                      f"  {'sinklab':>8} {'numpy':>8} {'ratio':>6}  {'NT same':>7} {'vs NT':>6}"
                      f"  {'max rel diff':>12}  reps")
                continue
            ratio = r["sl"] / r["np"]
            ratios.setdefault(f"{r['layout']} {threads}T", []).append(ratio)
            nt = ""
            if "nt" in r:
                vs_nt.setdefault(f"{r['layout']} {threads}T", []).append(r["sl"] / r["nt"])
                nt = f"{r['nt']:>7.1f} {r['sl'] / r['nt']:>6.2f}"
            print(f"{r['layout']:<3} {r['M']:>6} {r['N']:>6} {r['K']:>6}  {r['name']:<9} {r['sl']:>8.1f} "
                  f"{r['np']:>8.1f} {ratio:>6.2f}  {r['sl_best']:>8.1f} {r['np_best']:>8.1f} "
                  f"{r['sl_best'] / r['np_best']:>6.2f}  {nt:>14}  {r['maxrel']:>12.1e}  {r['reps']}")
        if proc.wait() != 0:
            sys.exit(f"benchmark child for {threads} thread(s) failed")
    if hasattr(os, "getloadavg"):
        print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())
    if ratios:
        print("GFLOP/s (median and best of the timed calls). Median ratios, geometric mean (min):")
        for key, rs in ratios.items():
            line = f"  {key}: sinklab / numpy {statistics.geometric_mean(rs):.2f} ({min(rs):.2f})"
            if key in vs_nt:
                v = vs_nt[key]
                line += f";  layout / NT on the same shapes {statistics.geometric_mean(v):.2f} ({min(v):.2f})"
            print(line)


if __name__ == "__main__":
    main()
