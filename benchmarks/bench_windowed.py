#!/usr/bin/env python
"""Windowed attention with kept sink tokens: sinklab vs transformers eager with the 4-D mask.

Part 1 (the analysis' workload): the NLL of the last --scored tokens of a T-token stretch under
a sliding window of w keys with the first k kept (StreamingLLM), SmolLM2-135M-Instruct:
  sinklab  model.run(ids, capture=("logits",), window=w, keep_first=k, logits_from=T-scored-1)
           and the NLL in NumPy (what sinklab.analysis.windowed does)
  hf       transformers' LlamaForCausalLM on the same GGUF weights (dequantized to fp32 by its
           GGUF loader), attn_implementation="eager", a custom (1, 1, T, T) float mask with the
           same window + sink pattern, logits_to_keep=scored+1, torch.inference_mode(); the NLL
           from the same rows
Both in one process, the same thread count (sinklab.set_num_threads, torch.set_num_threads),
alternated --repeats times; medians, and the ratio hf / sinklab. The NLLs are printed side by
side (they agree to ~1e-5).

Part 2 (cost): sinklab's windowed forward (last logits only) at T = 1024 .. --longest with the
same w, k against full causal attention: time per token stays flat with the window (O(T·(w+k)))
and grows with T without it.

Usage:
  python benchmarks/bench_windowed.py [--threads 2] [--T 512,2048] [--w 128] [--k 4] [--scored 128]
      [--repeats 3] [--longest 8192]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.machine import cpu_name, lscpu_lines  # noqa: E402


def mask_4d(torch, T, w, k):
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    ok = (j <= i) & ((j > i - w) | (j < k))
    return torch.from_numpy(np.where(ok, 0.0, np.finfo(np.float32).min).astype(np.float32))[None, None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", default="512,2048")
    ap.add_argument("--w", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--scored", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--longest", type=int, default=8192)
    a = ap.parse_args()

    import torch
    import sinklab as sl
    from sinklab.analysis.long_context import long_texts
    from sinklab.analysis.quality import nll_rows
    from sinklab.io import registry
    from tests.support.reference_models import hf_gguf_model

    sl.set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    print(f"CPU: {cpu_name()}")
    for ln in lscpu_lines():
        print("  " + ln)
    print(f"threads {a.threads}, sinklab simd {sl.simd()}, torch {torch.__version__}")
    path = registry.fetch("smollm2-135m-instruct")
    model = sl.load(str(path), quiet=True)
    hf = hf_gguf_model(str(path))
    hf.config._attn_implementation = "eager"
    w, k, S = a.w, a.k, a.scored
    print(f"\nPart 1: windowed NLL of the last {S} tokens, w={w}, k={k} (SmolLM2-135M)")
    print(f"{'T':>6} {'sinklab s':>10} {'hf s':>10} {'hf/sinklab':>11} {'NLL sinklab':>12} {'NLL hf':>10}")
    for T in (int(x) for x in a.T.split(",")):
        ids = long_texts(model, T, 1)[0]
        mask = mask_4d(torch, T, w, k)
        ts, th = [], []
        for _ in range(a.repeats):
            t = time.perf_counter()
            tr = model.run(ids, capture=("logits",), window=w, keep_first=k, logits_from=T - S - 1, progress=False)
            nll_s = nll_rows(tr.logits[:S], ids[T - S:]).mean()
            ts.append(time.perf_counter() - t)
            t = time.perf_counter()
            with torch.inference_mode():
                out = hf(input_ids=torch.from_numpy(ids[None]), attention_mask=mask, use_cache=False,
                         logits_to_keep=S + 1)
            nll_h = nll_rows(out.logits[0, :S].float().numpy(), ids[T - S:]).mean()
            th.append(time.perf_counter() - t)
        ms, mh = statistics.median(ts), statistics.median(th)
        print(f"{T:>6} {ms:>10.3f} {mh:>10.3f} {mh / ms:>10.2f}x {nll_s:>12.5f} {nll_h:>10.5f}")

    print(f"\nPart 2: sinklab forward (last logits), window w={w} + k={k} vs full causal attention")
    print(f"{'T':>6} {'window s':>10} {'ms/token':>9} {'full s':>10} {'ms/token':>9} {'full/window':>12}")
    T = 1024
    while T <= a.longest:
        ids = np.random.default_rng(0).integers(0, model.config.vocab_size, T)
        tw, tf = [], []
        for _ in range(max(1, a.repeats - 1)):
            t = time.perf_counter()
            model.run(ids, capture=("logits",), window=w, keep_first=k, logits_from=-1, progress=False)
            tw.append(time.perf_counter() - t)
            t = time.perf_counter()
            model.run(ids, capture=("logits",), logits_from=-1, progress=False)
            tf.append(time.perf_counter() - t)
        mw, mf = statistics.median(tw), statistics.median(tf)
        print(f"{T:>6} {mw:>10.3f} {1e3 * mw / T:>9.3f} {mf:>10.3f} {1e3 * mf / T:>9.3f} {mf / mw:>11.2f}x")
        T *= 2


if __name__ == "__main__":
    main()
