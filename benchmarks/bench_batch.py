#!/usr/bin/env python
"""Batches and buffers: one batched forward against a loop over sequences, and fresh capture
buffers against an out= refill.

    python benchmarks/bench_batch.py a [REPS] [THREADS]   # 144 x 64 tokens, capture="stats":
                                                          # model.run on the (144, 64) batch vs
                                                          # 144 calls on one sequence each,
                                                          # alternating, best of REPS (default 2),
                                                          # threads "1,2"
    python benchmarks/bench_batch.py b                    # T = 2048, capture="attn" (4.5 GB),
                                                          # 1 thread: first run (cold), out=
                                                          # refill, plain runs (new buffers)

SmolLM2-135M-Instruct (the registry's GGUF, fp32). Both parts check that the contenders give the
same bits. Fresh buffers cost page faults: NumPy returns big allocations to the system on free,
so every plain run touches new pages, which an out= refill does not.
"""
import gc
import subprocess
import sys
import time

import numpy as np
import sinklab as sl
from sinklab import _core

def load():
    return subprocess.run("uptime", capture_output=True, text=True).stdout.strip()

part = sys.argv[1]
m = sl.load("smollm2-135m-instruct", quiet=True)
print("cpu:", subprocess.run("lscpu | grep -E 'Model name'", shell=True, capture_output=True, text=True).stdout.strip())
print("simd:", _core.simd(), "load at start:", load())
rng = np.random.default_rng(0)
if part == "a":
    ids = rng.integers(0, m.config.vocab_size, (144, 64))
    ids[:, 0] = m.config.bos_token_id
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for th in [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,2").split(",")]:
        sl.set_num_threads(th)
        m.run(ids[:4], capture="stats", progress=False)  # warm the workspace and code
        res = {"batched": [], "loop": []}
        for r in range(reps):
            for name in ("batched", "loop") if r % 2 == 0 else ("loop", "batched"):
                t0 = time.perf_counter()
                if name == "batched":
                    tb = m.run(ids, capture="stats", progress=False)
                else:
                    outs = [m.run(ids[b], capture="stats", progress=False) for b in range(len(ids))]
                res[name].append(time.perf_counter() - t0)
        same = all(np.array_equal(tb.stats.importance[b], outs[b].stats.importance) for b in range(len(ids)))
        bt, lp = min(res["batched"]), min(res["loop"])
        print(f"threads={th}: batched {bt:.2f} s (runs {[round(x, 2) for x in res['batched']]}), "
              f"per-sequence loop {lp:.2f} s (runs {[round(x, 2) for x in res['loop']]}), "
              f"speedup {lp / bt:.2f}x, bitwise equal: {same}; load {load()}")
else:
    T = 2048
    sl.set_num_threads(1)
    ids = rng.integers(0, m.config.vocab_size, T)
    ids[0] = m.config.bos_token_id
    t0 = time.perf_counter(); tr = m.run(ids, capture="attn", progress=False); cold = time.perf_counter() - t0
    print(f"cold (first run, new 4.5 GB buffer + workspace): {cold:.2f} s; load {load()}")
    ref = tr.attn[5, 3, 100:110].copy()
    t0 = time.perf_counter(); tr2 = m.run(ids, capture="attn", progress=False, out=tr); warm = time.perf_counter() - t0
    print(f"warm (out= refill): {warm:.2f} s; same object {tr2.attn is tr.attn}; equal {np.array_equal(ref, tr2.attn[5, 3, 100:110])}; load {load()}")
    del tr, tr2; gc.collect()
    t0 = time.perf_counter(); tr3 = m.run(ids, capture="attn", progress=False); plain = time.perf_counter() - t0
    print(f"plain second run (new buffer, cached workspace): {plain:.2f} s; load {load()}")
    del tr3; gc.collect()
    t0 = time.perf_counter(); tr4 = m.run(ids, capture="attn", progress=False); plain2 = time.perf_counter() - t0
    t0 = time.perf_counter(); m.run(ids, capture="attn", progress=False, out=tr4); warm2 = time.perf_counter() - t0
    print(f"again: plain {plain2:.2f} s, out= {warm2:.2f} s; load {load()}")
