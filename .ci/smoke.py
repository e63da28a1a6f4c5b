"""Smoke test of an installed sinklab (run by .ci/packaging in a fresh venv, from outside the
source tree so that the installed package is the one imported).

It prints sl.build_info(), checks that the build is the intended one (compiler family, OpenMP,
one import warning exactly when there is no OpenMP), loads the registered SmolLM2-135M (fetched
into ~/.cache/sinklab/models on first use) and runs a sink study over the first shipped
passages at T = 64, with the CPU's best SIMD kernels and with the portable C path, each on 1
and on 2 threads (which must agree bitwise: results do not depend on the thread count). The
first-token importance (P, L, H) goes to PREFIX.LEVEL.npy; given --compare, it must be within
--tol (max abs difference) of another build's.

    python .ci/smoke.py --compiler gcc --openmp 1 --out out/gcc
    python .ci/smoke.py --compiler clang --openmp 0 --out out/clang --compare out/gcc
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np


def fail(msg: str) -> None:
    print(f"smoke: FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def save_atomic(path: str, arr: np.ndarray) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".npy.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiler", choices=("gcc", "clang"), required=True, help="expected compiler family")
    ap.add_argument("--openmp", choices=("0", "1"), required=True, help="expected OpenMP (1) or not (0)")
    ap.add_argument("--out", required=True, help="prefix of the importance arrays written (PREFIX.LEVEL.npy)")
    ap.add_argument("--compare", help="--out prefix of another build's arrays to compare with")
    ap.add_argument("--tol", type=float, default=1e-5, help="max abs difference allowed against --compare")
    ap.add_argument("--T", type=int, default=64, help="tokens per passage (default 64)")
    ap.add_argument("--passages", type=int, default=24, help="first N shipped passages (default 24)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import sinklab as sl
    for w in caught:
        print(f"smoke: import warning: {w.message}", flush=True)

    info = sl.build_info()
    print(json.dumps(info, indent=1, sort_keys=True), flush=True)
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.commonpath([os.path.abspath(sl.__file__), os.path.dirname(here)]) == os.path.dirname(here):
        fail(f"imported sinklab from the source tree ({sl.__file__}), not the installed package")
    if info["compiler_family"] != args.compiler:
        fail(f"built by {info['compiler']!r}, expected {args.compiler}")
    if info["openmp"] != (args.openmp == "1"):
        fail(f"openmp={info['openmp']}, expected {args.openmp == '1'}")
    # one warning, of one line, exactly when the build has no OpenMP
    omp_warnings = [str(w.message) for w in caught if "without OpenMP" in str(w.message)]
    if len(omp_warnings) != (0 if info["openmp"] else 1) or any("\n" in m for m in omp_warnings):
        fail(f"expected {0 if info['openmp'] else 1} one-line OpenMP warning at import, got {omp_warnings}")
    if "-march=native" in info["cflags"] or "-ffp-contract=off" not in info["cflags"]:
        fail(f"unexpected flags: {info['cflags']}")

    model = sl.load("smollm2-135m-instruct", quiet=True)
    prompts = sl.load_passages("sinks")[: args.passages]
    t1 = time.perf_counter()
    # The CPU's best kernels (intrinsics: little left to the compiler) and the portable C path
    # (all the compiler's own code generation), each on 1 and 2 threads.
    for level in dict.fromkeys((sl._core.simd_best(), "generic")):
        sl._core.set_simd(level)
        runs = {}
        for n in (1, 2):
            sl.set_num_threads(n)
            t = time.perf_counter()
            runs[n] = sl.sink_study(model, prompts, T=args.T, progress=False).importance
            print(f"smoke: sink study ({sl.simd()}), {len(prompts)} passages x T={args.T}, "
                  f"{sl.get_num_threads()} thread(s): {time.perf_counter() - t:.1f} s", flush=True)
        imp = runs[1]
        if imp.shape != (len(prompts), model.config.n_layers, model.config.n_heads) or not np.isfinite(imp).all():
            fail(f"importance has shape {imp.shape} or non-finite values")
        if not np.array_equal(runs[1], runs[2]):
            fail(f"{level}: 1 and 2 threads differ: max abs {np.abs(runs[1] - runs[2]).max():.3g}")
        save_atomic(f"{args.out}.{level}.npy", imp)
        if args.compare:
            ref_path = f"{args.compare}.{level}.npy"
            ref = np.load(ref_path)
            if ref.shape != imp.shape:
                fail(f"shape {imp.shape} differs from {ref_path}'s {ref.shape}")
            diff = float(np.abs(imp - ref).max())
            print(f"smoke: {level}: max abs difference against {os.path.basename(ref_path)}: {diff:.3g} "
                  f"(bitwise equal: {np.array_equal(imp, ref)}; tolerance {args.tol:g})", flush=True)
            if diff > args.tol:
                fail(f"{level}: differs from {ref_path} by {diff:.3g} > {args.tol:g}")
    print(f"smoke: OK ({info['compiler']}, openmp={info['openmp']}, simd_best={info['simd_best']}; "
          f"load {t1 - t0:.1f} s, studies {time.perf_counter() - t1:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
