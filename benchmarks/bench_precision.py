"""Speed of the bf16 (and, in the forward rows, int8) path, side by side in one process: sinklab fp32, sinklab bf16, torch fp32 and
torch bf16, at 1 and 2 threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_precision.py
    python benchmarks/bench_precision.py --threads 1 --no-forward --reps 5

1. GEMM on model shapes, C[M×N] = A[M×K]·Wᵀ (SmolLM2's MLP up/gate 512×1536×576, attention
   512×576×576, and 2048³), GFLOP/s = 2MNK / median time. sinklab fp32: _core.sgemm_nt into a
   preallocated C. sinklab bf16: the weight packed into bf16 panels once (as a model keeps them),
   then the product alone (_core._bf16_linear's repeat count: time(repeat=1+r) - time(repeat=1),
   so packing is left out; the rounding of A to bf16 is included). torch: torch.nn.functional.linear
   on float32 / bfloat16 tensors (oneDNN or MKL, whatever the installed torch uses on this CPU).
   "peak" is sinklab bf16 as a fraction of the register-only vdpbf16ps rate measured by
   _core._bf16_peak on as many threads at once.
2. SmolLM2-135M forward, T = 512 random ids, logits of every position: sinklab at precision
   "fp32", "bf16" and "int8" (panels built before timing), transformers (sdpa attention, use_cache=False)
   in float32 and in bfloat16, the same GGUF weights (dequantized by transformers).

Threads: sinklab through sl.threads(n), torch through torch.set_num_threads(n), in turn; every
row is the median of --reps timed calls after a warm-up. Prints lscpu's model and flags,
sl.simd() and the bf16 kernel path first.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sinklab as sl  # noqa: E402
from sinklab import _core  # noqa: E402
from machine import cpu_name, lscpu_lines  # noqa: E402

SHAPES = [(512, 1536, 576), (512, 576, 576), (2048, 2048, 2048)]


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def peak(n_threads, iters=100_000_000):
    """Register-only vdpbf16ps GFLOP/s on n threads at once (each its own Python thread; the hook
    releases the GIL)."""
    out = [0.0] * n_threads

    def work(i):
        out[i] = _core._bf16_peak(iters)

    ths = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return sum(out)


def gemm_rows(threads, reps):
    import torch

    rng = np.random.default_rng(0)
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        pk = peak(n)
        for M, N, K in SHAPES:
            A = rng.standard_normal((M, K)).astype(np.float32)
            W = rng.standard_normal((N, K)).astype(np.float32)
            C = np.empty((M, N), np.float32)
            flop = 2.0 * M * N * K
            r = {"threads": n, "shape": f"{M}x{N}x{K}", "peak_bf16": pk}
            with sl.threads(n):
                r["sl_fp32"] = flop / median_time(lambda: _core.sgemm_nt(A, W, C), reps) / 1e9
                extra = 4 if M * N * K > 1e9 else 10
                t1 = median_time(lambda: _core._bf16_linear(A, W, C=C, repeat=1), reps)
                tr = median_time(lambda: _core._bf16_linear(A, W, C=C, repeat=1 + extra), reps)
                r["sl_bf16"] = flop * extra / max(tr - t1, 1e-9) / 1e9
            ta, tw = torch.from_numpy(A), torch.from_numpy(W)
            ba, bw = ta.to(torch.bfloat16), tw.to(torch.bfloat16)
            with torch.no_grad():
                r["torch_fp32"] = flop / median_time(lambda: torch.nn.functional.linear(ta, tw), reps) / 1e9
                r["torch_bf16"] = flop / median_time(lambda: torch.nn.functional.linear(ba, bw), reps) / 1e9
            rows.append(r)
            print(f"  gemm {r['shape']} {n} thr: sinklab fp32 {r['sl_fp32']:.0f}, bf16 {r['sl_bf16']:.0f} "
                  f"({100 * r['sl_bf16'] / pk:.0f} % of peak {pk:.0f}), torch fp32 {r['torch_fp32']:.0f}, "
                  f"bf16 {r['torch_bf16']:.0f} GFLOP/s", flush=True)
    return rows


def forward_rows(threads, reps, T):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    model = sl.load("smollm2-135m-instruct", quiet=True)
    path = model.source
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="sdpa").eval()
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="sdpa").eval().to(torch.bfloat16)
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, T)
    tids = torch.from_numpy(ids)[None]
    model.run(ids, capture="logits", precision="bf16")  # builds the panels
    model.run(ids, capture="logits", precision="int8")
    rows = []
    for n in threads:
        torch.set_num_threads(n)
        r = {"threads": n, "T": T}
        with sl.threads(n):
            for p in ("fp32", "bf16", "int8"):
                r[f"sl_{p}"] = median_time(lambda: model.run(ids, capture="logits", precision=p), reps)
        with torch.no_grad():
            r["torch_fp32"] = median_time(lambda: hf32(tids, use_cache=False), reps)
            r["torch_bf16"] = median_time(lambda: hf16(tids, use_cache=False), reps)
        rows.append(r)
        print(f"  forward T={T} {n} thr: sinklab fp32 {r['sl_fp32']:.3f} s, bf16 {r['sl_bf16']:.3f} s "
              f"({r['sl_fp32'] / r['sl_bf16']:.2f}x), int8 {r['sl_int8']:.3f} s ({r['sl_fp32'] / r['sl_int8']:.2f}x), torch fp32 {r['torch_fp32']:.3f} s, "
              f"bf16 {r['torch_bf16']:.3f} s", flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--no-gemm", action="store_true")
    ap.add_argument("--no-forward", action="store_true")
    a = ap.parse_args(argv)
    print(f"CPU: {cpu_name()}")
    for ln in lscpu_lines():
        print("  " + ln)
    feats = sl.build_info()["cpu_features"]
    print(f"sl.simd(): {sl.simd()}; bf16 kernel: {_core._bf16_path(0)}; cpu_features: "
          + " ".join(k for k, v in feats.items() if v))
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    import torch
    print(f"torch {torch.__version__}, {torch.backends.mkldnn.is_available() and 'oneDNN' or 'no oneDNN'}")
    g = [] if a.no_gemm else gemm_rows(a.threads, a.reps)
    f = [] if a.no_forward else forward_rows(a.threads, a.reps, a.T)
    if g:
        print("\n| GEMM (GFLOP/s) | threads | sinklab fp32 | sinklab bf16 | bf16 / fp32 | bf16 % of peak | torch fp32 | torch bf16 |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in g:
            print(f"| {r['shape']} | {r['threads']} | {r['sl_fp32']:.0f} | {r['sl_bf16']:.0f} | "
                  f"{r['sl_bf16'] / r['sl_fp32']:.2f}× | {100 * r['sl_bf16'] / r['peak_bf16']:.0f} % "
                  f"({r['peak_bf16']:.0f}) | {r['torch_fp32']:.0f} | {r['torch_bf16']:.0f} |")
    if f:
        print("\n| SmolLM2 forward, logits (s) | threads | sinklab fp32 | sinklab bf16 | fp32 / bf16 | sinklab int8 | "
              "fp32 / int8 | transformers fp32 (sdpa) | transformers bf16 (sdpa) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in f:
            print(f"| T = {r['T']} | {r['threads']} | {r['sl_fp32']:.3f} | {r['sl_bf16']:.3f} | "
                  f"{r['sl_fp32'] / r['sl_bf16']:.2f}× | {r['sl_int8']:.3f} | {r['sl_fp32'] / r['sl_int8']:.2f}× | "
                  f"{r['torch_fp32']:.3f} | {r['torch_bf16']:.3f} |")


if __name__ == "__main__":
    main()
