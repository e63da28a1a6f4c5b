"""SGEMM speed: sinklab._core.sgemm against NumPy (OpenBLAS) on the linear layers of SmolLM2-135M,
Gemma-3-270m and Qwen2.5-0.5B, forward and backward, plus a 2048^3 square product.

    python benchmarks/bench_sgemm.py                 # all rows; 1 and 2 threads
    python benchmarks/bench_sgemm.py --threads 1 --layouts NN TN --T-bwd 512 --reps 9
    python benchmarks/bench_sgemm.py --simd avx2 avx512 --models smollm2 --layouts NT
    python benchmarks/bench_sgemm.py --no-square --models gemma qwen

--simd runs sinklab at each listed level in the same process (alternating with NumPy), to show
what each kernel gains; the ratio columns are sinklab at that level / NumPy. The default is the
best level of the CPU only.

Layouts, for a weight W stored (out, in) and T rows (tokens, or a batch of cotangents):
    NT  forward        y  = x @ W.T    M = T,   N = out, K = in    (A (T, in),  B = W (out, in))
    NN  input grad     dx = dy @ W     M = T,   N = in,  K = out   (A (T, out), B = W (out, in))
    TN  weight grad    dW = dy.T @ x   M = out, N = in,  K = T     (A (T, out), B = x (T, in))
    SQ  square         C  = A @ B.T    M = N = K = 2048 (layout NT; --no-square drops it)
NT runs for T in --T; NN for T in --T-bwd (512 tokens, and for SmolLM2 64*576 = 36864 rows for a
batch of 64 cotangents of a 576-wide residual); TN for K = T = 512. The vocabulary projections of
Gemma (262144 x 640) and Qwen are left out: one call would take seconds. For NN and TN rows, sinklab's NT on the
same (M, N, K) (operands copied to the NT layout) is timed too: "vs NT" = layout / NT speed, the
cost of the layout itself.

Weights kept quantized (sl_linear_nt/nn, decoding while packing) against float32: bench_quant.py.

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
import statistics
import subprocess
import sys
import time

from machine import cpu_name, lscpu_lines

# (out, in) of each weight and its layer, per model.
MODELS = {
    # SmolLM2-135M: d_model 576, q dim 576, k/v dim 192, d_ff 1536, vocab 49152
    "smollm2": [((576, 576), "q/o proj"), ((192, 576), "k/v proj"), ((1536, 576), "gate/up"),
                ((576, 1536), "down"), ((49152, 576), "lm head")],
    # Gemma-3-270m: d_model 640, q dim 1024, k/v dim 256, d_ff 2048
    "gemma": [((1024, 640), "q proj"), ((256, 640), "k/v proj"), ((640, 1024), "o proj"),
              ((2048, 640), "gate/up"), ((640, 2048), "down")],
    # Qwen2.5-0.5B: d_model 896, q dim 896, k/v dim 128, d_ff 4864
    "qwen": [((896, 896), "q/o proj"), ((128, 896), "k/v proj"), ((4864, 896), "gate/up"),
             ((896, 4864), "down")],
}
SHORT = {"smollm2": "S", "gemma": "G", "qwen": "Q"}
BIG = 10_000  # rows above this: batched cotangents; the lm head is not run there
SQUARE = 2048


def cases(layouts: list[str], Ts: list[int], Ts_bwd: list[int], Ks_tn: list[int], models: list[str],
          square: bool):
    """(layout, M, N, K, "model:layer") of every row; layout "SQ" is the square NT product."""
    weights = [(w, f"{SHORT[m]}:{name}") for m in models for w, name in MODELS[m]]
    out = []
    if "NT" in layouts:
        out += [("NT", T, o, i, name) for T in Ts for (o, i), name in weights]
    if "NN" in layouts:
        out += [("NN", T, i, o, name) for T in Ts_bwd for (o, i), name in weights
                if T < BIG or (name.startswith("S:") and o < BIG)]
    if "TN" in layouts:
        out += [("TN", o, i, T, name) for T in Ks_tn for (o, i), name in weights]
    if square:
        out.append(("SQ", SQUARE, SQUARE, SQUARE, "square"))
    return out


def child(threads: int, rows: list, reps: int, seconds: float, simds: list[str]) -> None:
    """Runs in the subprocess: times every case, prints one JSON line per result."""
    import numpy as np

    try:
        from sinklab import _core as core
    except ImportError:  # run from a checkout with the extension built in place
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from sinklab import _core as core

    core.set_num_threads(threads)
    levels = []  # the levels asked for, as the CPU provides them (a missing one falls back)
    for name in simds or ["auto"]:
        got = core.set_simd(name)
        if got not in levels:
            levels.append(got)
    blas = {}
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            blas = {k: info[0].get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
    except ImportError:
        pass
    print(json.dumps({"meta": True, "threads": threads, "levels": levels, "blas": blas,
                      "numpy": np.__version__}), flush=True)
    rng = np.random.default_rng(0)
    last = levels[-1]
    for layout, M, N, K, name in rows:
        ta, tb = layout[0] == "T", layout[1] == "T"
        if layout == "SQ":
            ta, tb = False, True
        A = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        B = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        opA, opB = (A.T if ta else A), (B.T if tb else B)  # numpy views: (M, K), (K, N)
        Cn = np.empty((M, N), np.float32)
        Cs = {lv: np.empty((M, N), np.float32) for lv in levels}
        # name -> (set-up before a block of calls, the call)
        funcs = {"np": (lambda: None, lambda: np.matmul(opA, opB, out=Cn))}
        for lv in levels:
            funcs["sl:" + lv] = (lambda lv=lv: core.set_simd(lv),
                                 lambda lv=lv: core.sgemm(A, B, Cs[lv], trans_a=ta, trans_b=tb))
        if layout in ("NN", "TN"):  # the same product in the NT layout: what the layout itself costs
            A_nt, B_nt = np.ascontiguousarray(opA), np.ascontiguousarray(opB.T)
            Ct = np.empty((M, N), np.float32)
            funcs["nt"] = (lambda: core.set_simd(last), lambda: core.sgemm(A_nt, B_nt, Ct))
        for setup, f in funcs.values():  # warm up: page faults, thread start
            setup()
            f()
            f()
        t0 = time.perf_counter()
        funcs["np"][1]()
        est = time.perf_counter() - t0
        n = max(reps if est < 0.1 else 3, min(50, int(seconds / max(est, 1e-6))))
        ts = {k: [] for k in funcs}
        # Alternate blocks of calls rather than single calls, and pause before each block: an
        # idle OpenBLAS worker keeps spinning for up to ~0.1 s after its call (OpenMP workers
        # for less), and a block timed inside that window runs at one-core speed.
        for _ in range(3):
            for k, (setup, f) in funcs.items():
                setup()
                time.sleep(0.3)
                f()
                for _ in range(-(-n // 3)):  # ceil: at least n calls in all
                    t0 = time.perf_counter()
                    f()
                    ts[k].append(time.perf_counter() - t0)
        scale = np.abs(Cn).max()
        err = max(float(np.abs(C - Cn).max() / scale) if scale > 0 else 0.0 for C in Cs.values())
        # the FMA levels (AVX2, AVX-512) run the same chains: the same bits
        same = all(np.array_equal(C, Cs[last]) for lv, C in Cs.items() if lv != "generic")
        flop = 2.0 * M * N * K
        r = {"layout": layout, "M": M, "N": N, "K": K, "name": name, "reps": len(ts["np"]), "maxrel": err,
             "same": same}
        for k, t in ts.items():
            r[k] = flop / statistics.median(t) / 1e9
            r[k + "_best"] = flop / min(t) / 1e9
        print(json.dumps(r), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--layouts", nargs="+", default=["NT", "NN", "TN"], choices=["NT", "NN", "TN"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--no-square", action="store_true", help=f"leave out the {SQUARE}^3 product")
    ap.add_argument("--simd", nargs="+", default=[], choices=["generic", "avx2", "avx512", "auto"],
                    help="sinklab levels to time side by side (default: the CPU's best)")
    ap.add_argument("--T", type=int, nargs="+", default=[128, 512], help="rows of the forward (NT) rows")
    ap.add_argument("--T-bwd", type=int, nargs="+", default=[512, 64 * 576], help="rows of the NN rows")
    ap.add_argument("--K-tn", type=int, nargs="+", default=[512], help="K = tokens of the TN rows")
    ap.add_argument("--reps", type=int, default=7, help="least number of timed calls per case (3 for slow ones)")
    ap.add_argument("--seconds", type=float, default=1.0, help="aim for about this long per case and library")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, json.loads(args.rows), args.reps, args.seconds, args.simd)
        return

    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical CPUs)   Python {platform.python_version()}")
    for line in lscpu_lines():
        print("  " + line)
    if hasattr(os, "getloadavg"):  # other processes on the machine make 2-thread numbers erratic
        print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    pinned = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if pinned:
        print(f"note: {pinned} is set and pins OpenBLAS's kernel (see the docstring)")
    rows = cases(args.layouts, args.T, args.T_bwd, args.K_tn, args.models, not args.no_square)
    ratios: dict[str, list[float]] = {}
    vs_nt: dict[str, list[float]] = {}
    for threads in args.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(threads), "--reps", str(args.reps),
               "--seconds", str(args.seconds), "--rows", json.dumps(rows)]
        if args.simd:
            cmd += ["--simd"] + args.simd
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        levels: list[str] = []
        for line in proc.stdout:
            r = json.loads(line)
            if r.get("meta"):
                levels = r["levels"]
                blas = r["blas"] or {"note": "threadpoolctl not installed; OpenBLAS kernel unknown"}
                print(f"\n== {threads} thread(s): sinklab levels {levels}, numpy {r['numpy']}, blas {blas}")
                print("GFLOP/s, median of the timed calls; ratio = sinklab at that level / numpy; "
                      "best = ratio of the fastest calls")
                head = f"{'op':<3} {'M':>6} {'N':>6} {'K':>6}  {'layer':<12} {'numpy':>7}"
                for lv in levels:
                    head += f" {lv:>8} {'ratio':>6}"
                head += f" {'best':>6}  {'NT same':>7} {'vs NT':>6}  {'max rel diff':>12}  reps"
                print(head)
                continue
            line = (f"{r['layout']:<3} {r['M']:>6} {r['N']:>6} {r['K']:>6}  {r['name']:<12} {r['np']:>7.1f}")
            for lv in levels:
                ratio = r["sl:" + lv] / r["np"]
                ratios.setdefault(f"{lv} {threads}T", []).append(ratio)
                if r["layout"] != "SQ":
                    ratios.setdefault(f"{lv} {threads}T {r['layout']}", []).append(ratio)
                line += f" {r['sl:' + lv]:>8.1f} {ratio:>6.2f}"
            last = levels[-1]
            line += f" {r['sl:' + last + '_best'] / r['np_best']:>6.2f}"
            nt = ""
            if "nt" in r:
                vs_nt.setdefault(f"{last} {threads}T {r['layout']}", []).append(r["sl:" + last] / r["nt"])
                nt = f"{r['nt']:>7.1f} {r['sl:' + last] / r['nt']:>6.2f}"
            line += f"  {nt:>14}  {r['maxrel']:>12.1e}  {r['reps']}"
            if not r["same"]:
                line += "  BITS DIFFER between FMA levels"
            print(line)
        if proc.wait() != 0:
            sys.exit(f"benchmark child for {threads} thread(s) failed")
    if hasattr(os, "getloadavg"):
        print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())
    if ratios:
        print("Median ratios sinklab / numpy: geometric mean (min), over all rows and per layout:")
        for key, rs in ratios.items():
            line = f"  {key:<18} {statistics.geometric_mean(rs):.2f} ({min(rs):.2f})  {len(rs)} rows"
            if key in vs_nt:
                v = vs_nt[key]
                line += f";  layout / NT on the same shapes {statistics.geometric_mean(v):.2f} ({min(v):.2f})"
            print(line)


if __name__ == "__main__":
    main()
