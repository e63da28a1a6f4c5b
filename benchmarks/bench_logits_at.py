"""The output head on chosen rows (``logits_at=``) against the span of rows ``logits_from`` must
compute to reach them, and against transformers (eager fp32, ``logits_to_keep`` = the same span,
the cheapest it offers for rows that are not a suffix), for the shape of a cloze forward: a
passage of T tokens whose scored rows are spread over it.

Usage: python benchmarks/bench_logits_at.py [--model gemma-3-270m] [--T 200] [--rows 8]
       [--threads 1] [--reps 5] [--torch]
Prints the CPU (lscpu), each median time and the ratios; the rows' logits are checked equal."""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import lscpu_lines  # noqa: E402

import sinklab as sl  # noqa: E402


def seconds(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--T", type=int, default=200, help="tokens per passage")
    ap.add_argument("--rows", type=int, default=8, help="scored rows, spread from T/4 to T-1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="also transformers eager fp32 (needs the GGUF reference)")
    a = ap.parse_args()
    for line in lscpu_lines():
        print(line)
    sl.set_num_threads(a.threads)
    m = sl.load(a.model, quiet=True)
    c = m.config
    rng = np.random.default_rng(0)
    ids = rng.integers(0, c.vocab_size, a.T)
    rows = np.unique(np.linspace(a.T // 4, a.T - 1, a.rows).astype(np.int64))
    lf = int(rows[0])
    print(f"{a.model}: d {c.d_model}, {c.n_layers} layers, vocabulary {c.vocab_size}; T = {a.T}, {len(rows)} rows "
          f"read ({rows.tolist()}), logits_from = {lf} computes {a.T - lf}; {a.threads} thread(s), sl.simd() = {sl.simd()}")
    at = m.run(ids, capture=("logits",), logits_at=rows, progress=False).logits
    full = m.run(ids, capture=("logits",), logits_from=lf, progress=False).logits
    assert np.array_equal(at, full[rows - lf]), "logits_at rows differ from logits_from's"
    t = {"logits_at (rows read)": lambda: m.run(ids, capture=("logits",), logits_at=rows, progress=False),
         "logits_from (span)": lambda: m.run(ids, capture=("logits",), logits_from=lf, progress=False),
         "last row only (body + 1 row)": lambda: m.run(ids, capture=("logits",), logits_from=a.T - 1, progress=False)}
    if a.torch:
        import torch
        sys.path.insert(0, str(ROOT))
        from tests.support.reference_models import hf_gguf_model
        torch.set_num_threads(a.threads)
        hf = hf_gguf_model(str(m.source))
        x = torch.tensor(ids)[None]
        with torch.no_grad():
            ref = hf(x, logits_to_keep=a.T - lf).logits[0].float().numpy()
        print(f"transformers vs sinklab on the rows: max |diff| {np.abs(ref[rows - lf] - at).max():.2e}")

        def hf_span():
            with torch.no_grad():
                hf(x, logits_to_keep=a.T - lf)
        t["transformers eager, logits_to_keep = span"] = hf_span
    times = {}
    for _ in range(a.reps):           # interleaved: each round runs every variant once
        for k, fn in t.items():
            times.setdefault(k, []).append(seconds(fn))
    base = statistics.median(times["logits_at (rows read)"])
    for k, v in times.items():
        mv = statistics.median(v)
        print(f"{k:45s} {mv * 1e3:9.1f} ms   {mv / base:5.2f}x logits_at")


if __name__ == "__main__":
    main()
