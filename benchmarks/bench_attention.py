"""Attention kernel per mask: causal, sliding window, bidirectional (encoders), soft-capped
(Gemma 2), each timed for forward, forward + stats, probabilities and backward; the causal path
also against the kernel before the masks were added (git rev OLD), built side by side.
Usage: python benchmarks/bench_attention.py [T] [threads] [reps]   (run on an idle machine)."""
import ctypes as C
import subprocess
import sys
import tempfile
import time
from pathlib import Path
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))   # tests.support: the kernel's ctypes structs, shared with the tests
from tests.support.attention_ctypes import Shape, ptr  # noqa: E402
from machine import lscpu_lines  # noqa: E402

DEPS = ("ops.c", "sgemm.c", "quant.c", "cpu.c", "common.c")
OLD = "0ec72ac"


def build(attn_src, tag, d):
    so = Path(d) / f"lib{tag}.so"
    files = [str(attn_src)] + [str(ROOT / "csrc" / f) for f in DEPS]
    subprocess.run(["cc", "-std=c11", "-O3", "-fno-strict-aliasing", "-fPIC", "-shared", "-fopenmp", "-DSL_HAVE_OPENMP=1",
                    f"-I{ROOT / 'csrc'}", "-o", str(so)] + files + ["-lm"], check=True)
    return C.CDLL(str(so))


def timeit(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t)
    return best


def main():
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    H, G, hd = 8, 2, 64
    r = np.random.default_rng(0)
    q = r.standard_normal((T, H * hd)).astype(np.float32)
    k, v = (r.standard_normal((T, G * hd)).astype(np.float32) for _ in range(2))
    dout = r.standard_normal((T, H * hd)).astype(np.float32)
    out = np.empty_like(q); probs = np.empty((H, T, T), np.float32)
    dq = np.empty_like(q); dk, dv = np.empty_like(k), np.empty_like(k); pk, pv = np.empty_like(q), np.empty_like(q)
    imp, tf, ent = (np.empty((H, T), np.float32) for _ in range(3))
    with tempfile.TemporaryDirectory() as d:
        old_src = Path(d) / "attention_old.c"
        old_src.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD}:csrc/attention.c"], check=True,
                                          capture_output=True, text=True).stdout)
        libs = {"old": build(old_src, "old", d), "new": build(ROOT / "csrc" / "attention.c", "new", d)}
        for lib in libs.values():
            lib.sl_set_num_threads(threads)
        scale = np.float32(1 / np.sqrt(hd))
        masks = [("causal", 0, 0, 0.0), ("window512", 0, 512, 0.0), ("window128", 0, 128, 0.0),
                 ("bidirectional", 1, 0, 0.0), ("softcap50", 0, 0, 50.0), ("softcap50+window512", 0, 512, 50.0)]
        for line in lscpu_lines():
            print(line)
        print(f"T={T} H={H} G={G} hd={hd} threads={threads}, best of {reps} (ms)")
        print(f"{'mask':22s} {'lib':4s} {'fwd':>8s} {'fwd+stats':>10s} {'probs':>8s} {'backward':>9s}")
        for name, bi, w, cap in masks:
            for tag, lib in libs.items():
                if tag == "old" and (bi or w or cap):
                    continue
                s = Shape(T, H, G, hd, scale, bi, w, cap)
                # the old struct has no mask fields; passing the new one is compatible (prefix)
                st = (C.c_void_p * 3)(imp.ctypes.data, tf.ctypes.data, ent.ctypes.data)
                f1 = lambda: lib.sl_attention_forward(C.byref(s), ptr(q), C.c_int64(H * hd), ptr(k), ptr(v),
                                                      C.c_int64(G * hd), ptr(out), None, None, None)
                f2 = lambda: lib.sl_attention_forward(C.byref(s), ptr(q), C.c_int64(H * hd), ptr(k), ptr(v),
                                                      C.c_int64(G * hd), ptr(out), None, None, C.byref(st))
                f3 = lambda: lib.sl_attention_probs(C.byref(s), ptr(q), ptr(k), ptr(probs), None)
                f4 = lambda: lib.sl_attention_backward(C.byref(s), C.c_int64(1), ptr(q), ptr(k), ptr(v), ptr(probs),
                                                       ptr(dout), ptr(dq), ptr(dk), ptr(dv), ptr(pk), ptr(pv), None)
                ts = [timeit(f, reps) * 1e3 for f in (f1, f2, f3, f4)]
                print(f"{name:22s} {tag:4s} {ts[0]:8.1f} {ts[1]:10.1f} {ts[2]:8.1f} {ts[3]:9.1f}")


if __name__ == "__main__":
    main()
