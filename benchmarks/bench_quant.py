"""Linear layers on weights kept quantized (sl_linear_nt / sl_linear_nn decode the blocks while
packing the weight panel) against the same layer on the float32 weight.

    python benchmarks/bench_quant.py                        # all models, M 1/16/128/512, NT
    python benchmarks/bench_quant.py --models smollm2 --M 1 128 --types Q4_K Q8_0 --threads 1
    python benchmarks/bench_quant.py --layouts NT NN --simd avx2 avx512
    python benchmarks/bench_quant.py --smoke               # tiny sizes: checks the script runs

For each weight (out, in) of SmolLM2-135M (d 576, F 1536), Qwen2.5-0.5B (d 896, F 4864) and
LLaMA-3-8B (d 4096, F 14336) and each M (tokens):
    NT  forward     C (M, out) = A (M, in) · Wᵀ
    NN  input grad  C (M, in)  = A (M, out) · W
is timed with the weight in F32 and in each type of --types (random blocks with realistic fp16
scales; the F32 weight is their exact decoding, so both compute the same numbers, bit for bit).
ratio = F32 time / quantized time: above 1 the quantized layer is faster (less memory to read),
below 1 decoding costs more than it saves. The goal is >= 0.9 at M >= 128. A type whose block does
not divide the row length (K-quants need in % 256 == 0) prints n/a, as llama.cpp falls back to
another type for such tensors.

The C core is compiled here into a shared library (csrc/sgemm.c, quant.c, cpu.c, common.c and a
timing shim), loaded with ctypes; each timing is a C loop of calls with a preallocated C, blocks
of calls of F32 and the quantized type alternate over --rounds rounds so slow drift of the machine
hits both alike, and the median per-call time is reported. Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"

# (out, in) of each weight of a layer, per model
MODELS = {
    "smollm2": [((576, 576), "q/o"), ((1536, 576), "gate/up"), ((576, 1536), "down")],
    "qwen": [((896, 896), "q/o"), ((4864, 896), "gate/up"), ((896, 4864), "down")],
    "llama8b": [((4096, 4096), "q/o"), ((14336, 4096), "gate/up"), ((4096, 14336), "down")],
}
# ggml type id, elements and bytes per block, byte offsets of the fp16 scales in a block
TYPES = {
    "F32": (0, 1, 4, []), "F16": (1, 1, 2, []), "BF16": (30, 1, 2, []),
    "Q4_0": (2, 32, 18, [0]), "Q4_1": (3, 32, 20, [0, 2]), "Q5_0": (6, 32, 22, [0]), "Q5_1": (7, 32, 24, [0, 2]),
    "Q8_0": (8, 32, 34, [0]), "Q4_K": (12, 256, 144, [0, 2]), "Q5_K": (13, 256, 176, [0, 2]),
    "Q6_K": (14, 256, 210, [208]),
}
LEVELS = {"generic": 0, "avx2": 1, "avx512": 2}

SHIM = r"""
#define _POSIX_C_SOURCE 199309L
#include <time.h>
#include "cpu.h"
#include "quant.h"
#include "sgemm.h"
#include "sl_common.h"

/* Seconds per call of `calls` calls of the layer (nn: C = A·W, else C = A·Wᵀ); -1 on error. */
double bq_time(int type, const void *raw, int64_t nbytes, int64_t rows, int64_t cols, int nn, int64_t M,
               const float *A, float *C, int calls) {
    sl_weight W;
    if (sl_weight_init(&W, type, raw, nbytes, rows, cols) != SL_OK) return -1.0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < calls; i++) {
        int rc = nn ? sl_linear_nn(M, A, rows, &W, C, cols, 0, 1) : sl_linear_nt(M, A, cols, &W, C, rows, 0, 1);
        if (rc != SL_OK) return -1.0;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / calls;
}
"""


def build_library(tmp: Path) -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        sys.exit("no C compiler")
    shim = tmp / "bq_shim.c"
    shim.write_text(SHIM)
    lib = tmp / "libbq.so"
    files = [str(shim)] + [str(CSRC / f) for f in ("sgemm.c", "quant.c", "cpu.c", "common.c")]
    # the flags of setup.py (never -march=native: the kernels pick their level at run time)
    cmd = [cc, "-std=c11", "-O3", "-Wall", "-Wextra", "-fno-strict-aliasing", "-fPIC", "-shared", "-fopenmp",
           "-DSL_HAVE_OPENMP=1", f"-I{CSRC}", "-o", str(lib)] + files + ["-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("build failed:\n" + r.stderr)
    so = ctypes.CDLL(str(lib))
    so.bq_time.restype = ctypes.c_double
    so.bq_time.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    so.sl_dequantize.restype = ctypes.c_int
    so.sl_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_int]
    so.sl_set_simd.restype = ctypes.c_int
    so.sl_set_simd.argtypes = [ctypes.c_int]
    so.sl_simd_best.restype = ctypes.c_int
    so.sl_set_num_threads.argtypes = [ctypes.c_int]
    so.sl_get_num_threads.restype = ctypes.c_int
    return so


def random_weight(rng, name: str, rows: int, cols: int) -> np.ndarray:
    """Raw bytes of a (rows, cols) weight: random quants, fp16 scales of real weights' size."""
    tid, be, bb, scales = TYPES[name]
    if name == "F16":
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16).view(np.uint8).reshape(-1)
    if name == "BF16":
        f = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    nb = rows * cols // be
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in scales:
        h = rng.uniform(1e-3, 2e-3, nb) * rng.choice([-1, 1], nb)
        raw[:, off:off + 2] = h.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def decode(so, tid: int, raw: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    if so.sl_dequantize(tid, raw.ctypes.data, raw.size, out.ctypes.data, n, 1) != 0:
        sys.exit("dequantize failed")
    return out


def time_pair(so, args, rows, cols, nn, M, A, C, weights):
    """Median seconds per call for each (tid, raw) of weights, alternating blocks over rounds."""
    def once(tid, raw, calls):
        t = so.bq_time(tid, raw.ctypes.data, raw.size, rows, cols, int(nn), M, A.ctypes.data, C.ctypes.data, calls)
        if t < 0:
            sys.exit("linear failed")
        return t

    calls = []
    for tid, raw in weights:  # warm up and size the blocks to ~--block seconds
        t = once(tid, raw, 1)
        calls.append(max(1, min(10_000, int(args.block / max(t, 1e-7)))))
    times = [[] for _ in weights]
    for _ in range(args.rounds):
        for i, (tid, raw) in enumerate(weights):
            times[i].append(once(tid, raw, calls[i]))
    return [statistics.median(t) for t in times]


def lscpu_summary() -> list[str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return [f"cpu: {cpu_name()}"]
    lines = []
    for line in out.splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("Model name", "CPU(s)", "Thread(s) per core", "L1d cache", "L2 cache", "L3 cache"):
            lines.append(line.strip())
        elif key == "Flags":
            flags = line.split(":", 1)[1].split()
            keep = [f for f in flags if f.startswith(("avx", "fma", "f16c", "sse4", "amx"))]
            lines.append("Flags (SIMD): " + " ".join(keep))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--M", nargs="+", type=int, default=[1, 16, 128, 512])
    p.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K", "Q8_0", "Q4_1", "F16"],
                   choices=[t for t in TYPES if t != "F32"])
    p.add_argument("--layouts", nargs="+", default=["NT"], choices=["NT", "NN"])
    p.add_argument("--threads", type=int, default=0, help="0: all cores (OpenMP's default)")
    p.add_argument("--simd", nargs="+", default=["auto"], choices=["auto"] + list(LEVELS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", type=float, default=0.3, help="seconds per timed block of calls")
    p.add_argument("--smoke", action="store_true", help="tiny shapes and blocks: checks that the script runs")
    args = p.parse_args()
    if args.smoke:
        MODELS["smoke"] = [((96, 512), "tiny"), ((512, 256), "tiny down")]
        args.models, args.M, args.rounds, args.block = ["smoke"], [1, 16], 1, 0.01

    for line in lscpu_summary():
        print(line)
    with tempfile.TemporaryDirectory() as tmp:
        so = build_library(Path(tmp))
        if args.threads > 0:
            so.sl_set_num_threads(args.threads)
        print(f"threads {so.sl_get_num_threads()}, best SIMD level {list(LEVELS)[so.sl_simd_best()]}")
        levels = [so.sl_simd_best() if s == "auto" else LEVELS[s] for s in args.simd]
        rng = np.random.default_rng(0)
        head = f"{'level':7} {'model':8} {'layer':8} {'(out, in)':>13} {'lay':3} {'M':>4}  {'F32 ms':>8}"
        print(head + "".join(f" {t:>8} {'ratio':>5}" for t in args.types))
        for model in args.models:
            for (rows, cols), layer in MODELS[model]:
                raws = {t: random_weight(rng, t, rows, cols) if cols % TYPES[t][1] == 0 else None
                        for t in args.types}
                for M in args.M:
                    for lay in args.layouts:
                        nn = lay == "NN"
                        A = rng.standard_normal((M, rows if nn else cols)).astype(np.float32)
                        C = np.empty((M, cols if nn else rows), np.float32)
                        for level in levels:
                            got = so.sl_set_simd(level)
                            cells = []
                            f32_ms = None
                            for t in args.types:
                                raw = raws[t]
                                if raw is None:
                                    cells.append(f" {'n/a':>8} {'':>5}")
                                    continue
                                # the F32 weight: the exact decoding of this one, the same numbers
                                f32 = decode(so, TYPES[t][0], raw, rows * cols).view(np.uint8)
                                tf, tq = time_pair(so, args, rows, cols, nn, M, A, C, [(0, f32), (TYPES[t][0], raw)])
                                f32_ms = tf * 1e3 if f32_ms is None else f32_ms
                                cells.append(f" {tq * 1e3:8.3f} {tf / tq:5.2f}")
                            name = list(LEVELS)[got]
                            f32s = f"{f32_ms:8.3f}" if f32_ms is not None else f"{'n/a':>8}"
                            print(f"{name:7} {model:8} {layer:8} {str((rows, cols)):>13} {lay:3} {M:4d}  {f32s}"
                                  + "".join(cells), flush=True)
    print("ratio = F32 time / quantized time (goal >= 0.9 at M >= 128); F32 ms from the first type's pairing")


if __name__ == "__main__":
    main()
