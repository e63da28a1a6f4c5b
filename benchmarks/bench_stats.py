"""Long-context attention statistics: time and peak memory of capture=("stats",) against a
plain forward of the same model, SmolLM2-135M-Instruct by default.

    python benchmarks/bench_stats.py [--T 8192] [--reps 2] [--threads 2]

Time: the two modes alternated in one process, median of --reps. Memory: each mode in its own
fresh subprocess, peak RSS (ru_maxrss) of the whole process, weights included. Both modes compute
only the last position's logits (all a long-context statistic needs).
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def run_once(model_name, T, mode, threads):
    import sinklab as sl

    sl.set_num_threads(threads)
    model = sl.load(model_name, quiet=True)
    T = min(T, model.config.context_length)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, T)
    ids[0] = model.config.bos_token_id
    cap = ("stats", "logits") if mode == "stats" else ("logits",)
    t = time.perf_counter()
    model.run(ids, capture=cap, logits_from=-1)
    return T, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=["plain", "stats"])
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_once(a.model, a.T, a.child, a.threads)))
        return
    rss = {}
    for mode in ("plain", "stats"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--T", str(a.T), "--model", a.model,
                              "--threads", str(a.threads)], capture_output=True, text=True, check=True)
        T, _, rss[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    import sinklab as sl

    sl.set_num_threads(a.threads)
    model = sl.load(a.model, quiet=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, T)
    times = {"plain": [], "stats": []}
    for _ in range(a.reps):
        for mode, cap in (("plain", ("logits",)), ("stats", ("stats", "logits"))):
            t = time.perf_counter()
            model.run(ids, capture=cap, logits_from=-1)
            times[mode].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"model {a.model}, T={T}, threads={a.threads}, simd={sl.simd()}, reps={a.reps}")
    print(f"{'mode':<8}{'median s':>10}{'peak RSS MB':>14}")
    for mode in ("plain", "stats"):
        print(f"{mode:<8}{med[mode]:>10.2f}{rss[mode]:>14.0f}")
    print(f"stats / plain time: {med['stats'] / med['plain']:.3f}x   (target <= 1.3x)")
    print(f"stats peak RSS: {rss['stats']:.0f} MB   (target < 1536 MB)")


if __name__ == "__main__":
    main()
