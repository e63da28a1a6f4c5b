#!/usr/bin/env python
"""int8 linear layers (csrc/gemm_int8.c, sl_linear_nt_int8 on a prepacked weight) against sinklab's
fp32 SGEMM (sl_sgemm_nt through _core.sgemm_nt, the weight dequantized to float32 once, as the
model holds it by default) on SmolLM2-135M's layer shapes, and against the register-only
vpdpbusd peak.

    python benchmarks/bench_int8.py                      # M = 128, 512, 2048; 1 and 2 threads
    python benchmarks/bench_int8.py --M 512 --threads 1 --reps 9 --types Q4_1
    python benchmarks/bench_int8.py --head               # adds the 49152 x 576 vocabulary projection
    python benchmarks/bench_int8.py --simd avx2          # both at the AVX2 level (int8: AVX-VNNI if the CPU has it)
    python benchmarks/bench_int8.py --simd avx2 --int8-kernel avx2   # int8 without any VNNI

Weights: layer 0 of the SmolLM2-135M-Instruct Q4_1 GGUF (read with sinklab's GGUF reader) when it
is in the sinklab cache, else random Q4_1 blocks of the same shapes; the Q8_0 rows quantize the
same dequantized matrices to Q8_0 with gguf-py. Activations: Gaussian float32 (M, K).

Timed, per (type, matrix, M, threads): one call of _core._linear_int8(A, packed) (which includes
quantizing A: the per-call cost a model pays) and one call of _core.sgemm_nt(A, W_f32, C), each
into a preallocated output, alternating, --reps rounds after a warm-up; the median is reported.
"int GOP/s" counts 2·M·N·K integer multiply-adds as 2 ops, the same count as the fp32 GFLOP/s, so
the columns compare directly; "x fp32" = t_fp32 / t_int8; "of peak" = int GOP/s / the measured
vpdpbusd peak at that thread count (_core._int8_peak: 24 independent zmm vpdpbusd chains, 128
ops each, nothing but registers; for the avx_vnni kernel 12 ymm chains of 64 ops; measured before the rows, and again after them to show how much
the machine's load moved). The "layer" row sums the seven matrices of one transformer layer
(q, k, v, o, gate, up, down); the "sharing" row times the same layer with q/k/v and gate/up each
quantizing their common input once (_core._linear_int8_shared: sl_int8_acts_init, then
sl_linear_nt_int8_acts per weight), against the same fp32 time.

llama.cpp: benchmarks/bench_llamacpp.py times llama-cpp-python's prompt processing; this script
reports whether llama_cpp is importable and does not time it (its per-matrix products are not
exposed through the binding).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
from machine import cpu_name, lscpu_lines

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

import sinklab._core as core  # noqa: E402

SHAPES = [("attn_q", 576, 576), ("attn_k", 192, 576), ("attn_v", 192, 576), ("attn_output", 576, 576),
          ("ffn_gate", 1536, 576), ("ffn_up", 1536, 576), ("ffn_down", 576, 1536)]
HEAD = ("token_embd", 49152, 576)


def smollm2_weights(head: bool):
    """{name: (rows, cols, float32 weight, Q4_1 bytes or None)} from the cached GGUF, or None."""
    path = os.path.join(os.environ.get("SINKLAB_HOME", os.path.expanduser("~/.cache/sinklab")), "models",
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        return None
    from sinklab.io.gguf_reader import GGUFFile
    tensors = {t.name: t for t in GGUFFile(path).tensors}
    out = {}
    for name, rows, cols in SHAPES + ([HEAD] if head else []):
        t = tensors[f"blk.0.{name}.weight" if name != "token_embd" else "token_embd.weight"]
        raw = np.ascontiguousarray(t.data)
        wf = gguf.quants.dequantize(raw.reshape(rows, -1), t.type).astype(np.float32).reshape(rows, cols)
        out[name] = (rows, cols, wf, raw if t.type == int(T.Q4_1) else None)
    return out


def random_weights(head: bool, rng):
    out = {}
    for name, rows, cols in SHAPES + ([HEAD] if head else []):
        wf = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        out[name] = (rows, cols, wf, None)
    return out


def peak(threads: int, iters: int = 20_000_000) -> float:
    """Best of 3 of the register-only loop of the kernel in use (zmm vpdpbusd for avx512_vnni, ymm
    for avx_vnni; the zmm one for the other kernels, which have no loop of their own)."""
    core.set_num_threads(threads)
    kind = "avx_vnni" if core._int8_info()["kernel"] == "avx_vnni" else "avx512_vnni"
    best = 0.0
    for _ in range(3):
        ops, secs = core._int8_peak(iters, kind)
        if secs > 0:
            best = max(best, ops / secs / 1e9)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--M", default="128,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--types", default="Q4_1,Q8_0")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--head", action="store_true", help="add the 49152 x 576 vocabulary projection")
    ap.add_argument("--simd", default="auto", help="SIMD level of both contenders (set_simd): auto, avx2, generic")
    ap.add_argument("--int8-kernel", default="auto",
                    help="cap the int8 kernel (avx512_vnni, avx_vnni, avx2, generic; default: the best)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    Ms = [int(x) for x in args.M.split(",")]
    threads_list = [int(x) for x in args.threads.split(",")]
    types = [getattr(T, x) for x in args.types.split(",")]

    core.set_simd(args.simd)
    core._int8_force_kernel(args.int8_kernel)
    print(f"# bench_int8  {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  cpu={cpu_name()}  "
          f"python={platform.python_version()}  simd={core.simd()}  int8={core._int8_info()}")
    for ln in lscpu_lines():
        print("#", ln)
    try:
        import llama_cpp  # noqa: F401
        print(f"# llama_cpp {getattr(llama_cpp, '__version__', '?')} importable: see bench_llamacpp.py for its rows")
    except ImportError:
        print("# llama_cpp (llama-cpp-python) is not installed here: no llama.cpp rows")
    if os.environ.get("OMP_NUM_THREADS"):
        print(f"# OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (threads are set per run with set_num_threads)")
    print(f"# load: {os.getloadavg()}")

    rng = np.random.default_rng(0)
    weights = smollm2_weights(args.head)
    source = "SmolLM2-135M-Instruct Q4_1 layer 0" if weights else "random (the GGUF is not cached)"
    if weights is None:
        weights = random_weights(args.head, rng)
    print(f"# weights: {source}")

    # the peak before the rows (used for "of peak") and again after them (printed at the end): on
    # shared cores a measurement can fall in a busy moment, which inflates every "of peak"
    peaks = {n: peak(n) for n in threads_list}

    packed = {}
    for qt in types:
        for name, (rows, cols, wf, raw) in weights.items():
            if raw is None or qt != T.Q4_1:
                raw = gguf.quants.quantize(wf, qt).view(np.uint8).ravel()
            packed[qt, name] = core._int8_prepack(raw.ravel(), int(qt), rows, cols)

    rows_out = []
    print()
    print("| type | matrix (N x K) | M | threads | int8 int GOP/s | fp32 GFLOP/s | x fp32 | of peak |")
    print("|---|---|---|---|---|---|---|---|")
    for qt in types:
        for M in Ms:
            for n in threads_list:
                core.set_num_threads(n)
                tot_i = tot_f = tot_ops = 0.0
                for name, (rows, cols, wf, _) in weights.items():
                    a = rng.standard_normal((M, cols)).astype(np.float32)
                    ci = np.zeros((M, rows), np.float32)
                    cf = np.zeros((M, rows), np.float32)
                    pk = packed[qt, name]
                    core._linear_int8(a, pk, out=ci)
                    core.sgemm_nt(a, wf, cf)
                    ti, tf = [], []
                    for _ in range(args.reps):
                        t0 = time.perf_counter()
                        core._linear_int8(a, pk, out=ci)
                        t1 = time.perf_counter()
                        core.sgemm_nt(a, wf, cf)
                        t2 = time.perf_counter()
                        ti.append(t1 - t0)
                        tf.append(t2 - t1)
                    mi, mf = statistics.median(ti), statistics.median(tf)
                    ops = 2.0 * M * rows * cols
                    tot_i, tot_f, tot_ops = tot_i + mi, tot_f + mf, tot_ops + ops
                    row = {"type": qt.name, "matrix": name, "N": rows, "K": cols, "M": M, "threads": n,
                           "int8_gops": ops / mi / 1e9, "fp32_gflops": ops / mf / 1e9, "speedup": mf / mi,
                           "of_peak": ops / mi / 1e9 / peaks[n] if peaks[n] else None}
                    rows_out.append(row)
                    print(f"| {qt.name} | {name} ({rows} x {cols}) | {M} | {n} | {row['int8_gops']:.0f} | "
                          f"{row['fp32_gflops']:.0f} | {row['speedup']:.2f} | "
                          f"{(row['of_peak'] or 0) * 100:.0f} % |")
                # the same layer with q/k/v and gate/up each sharing one quantization of their
                # input (sl_int8_acts: what a model wiring can do), o and down alone
                groups = [["attn_q", "attn_k", "attn_v"], ["attn_output"], ["ffn_gate", "ffn_up"], ["ffn_down"]]
                tot_s = 0.0
                if all(n_ in weights for grp in groups for n_ in grp):
                    for grp in groups:
                        a = rng.standard_normal((M, weights[grp[0]][1])).astype(np.float32)
                        caps = [packed[qt, n_] for n_ in grp]
                        core._linear_int8_shared(a, caps)
                        ts = []
                        for _ in range(args.reps):
                            t0 = time.perf_counter()
                            core._linear_int8_shared(a, caps)
                            ts.append(time.perf_counter() - t0)
                        tot_s += statistics.median(ts)
                g = tot_ops / tot_i / 1e9
                print(f"| {qt.name} | **layer (7 matrices)** | {M} | {n} | **{g:.0f}** | {tot_ops / tot_f / 1e9:.0f} | "
                      f"**{tot_f / tot_i:.2f}** | {g / peaks[n] * 100 if peaks[n] else 0:.0f} % |")
                if tot_s:
                    gs = tot_ops / tot_s / 1e9
                    print(f"| {qt.name} | layer, q/k/v and gate/up sharing their quantized input | {M} | {n} | "
                          f"{gs:.0f} | {tot_ops / tot_f / 1e9:.0f} | {tot_f / tot_s:.2f} | "
                          f"{gs / peaks[n] * 100 if peaks[n] else 0:.0f} % |")
                    rows_out.append({"type": qt.name, "matrix": "layer_shared", "M": M, "threads": n,
                                     "int8_gops": gs, "speedup": tot_f / tot_s})
                rows_out.append({"type": qt.name, "matrix": "layer", "M": M, "threads": n, "int8_gops": g,
                                 "fp32_gflops": tot_ops / tot_f / 1e9, "speedup": tot_f / tot_i,
                                 "of_peak": g / peaks[n] if peaks[n] else None})
    for n in threads_list:
        after = peak(n)
        print(f"# vpdpbusd peak ({'ymm' if core._int8_info()['kernel'] == 'avx_vnni' else 'zmm'}), {n} thread(s): {peaks[n]:.0f} before, {after:.0f} after the rows (int GOP/s); "
              f"'of peak' above used the before value")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "peaks": peaks, "weights": source, "rows": rows_out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
