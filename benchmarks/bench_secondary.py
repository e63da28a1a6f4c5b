#!/usr/bin/env python
"""Secondary sinks: Gu's a_k for every (layer, head, key), sinklab against transformers.

The workload: one stretch of the shipped passages joined by blank lines (what
``sl.secondary_sinks`` runs), T tokens, the model's own ⟨bos⟩ rule; the result is a_k =
sum_{i sees k} A[i, k] / n_k for every layer, head and key k, (L, H, T).

Contenders, timed alternately in one process (the order rotates every round), per thread count:
  sl       model.run(ids, capture=("stats",), logits_from=-1): the C kernel streams the column
           sums, no T x T buffer; a_k from them by sinklab.analysis.secondary.column_mean
  hf_hook  transformers' base model (no LM head), attn_implementation="eager", fp32, under
           torch.inference_mode(), torch.set_num_threads(n): a forward hook on every attention
           module sums the eager probabilities it returns over the queries (a_k in torch), then
           drops them, so one layer's (H, T, T) is held at a time
  hf_oa    (T <= --oa-max) the same model with output_attentions=True, a_k from every layer's
           returned probabilities afterwards (what a user of output_attentions does; it holds
           L x H x T x T floats)
All read the same weights: transformers loads the same GGUF (dequantized to fp32 by its loader).
Each contender runs once untimed first (weights paged in, workspaces allocated). Printed: median
and minimum seconds over --repeats, the ratio hf / sl, the largest relative
difference of the contenders' a_k, and lscpu's CPU model and SIMD flags.

Usage:
  python benchmarks/bench_secondary.py [--model PATH.gguf] [--T 512 2048] [--threads 1 2]
      [--repeats 3] [--oa-max 1024] [--sl-only 8192]
--sl-only times sinklab alone at those lengths (transformers' eager attention at T = 8192 needs
one 2.4 GB probability tensor per layer for SmolLM2, and output_attentions 72 GB in all).
"""
import argparse
import os
import resource
import statistics
import sys
import time

import numpy as np

from machine import cpu_name, lscpu_lines

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def default_model():
    from sinklab.io import registry
    return str(registry.fetch("smollm2-135m-instruct", quiet=True))


def load_hf(path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m.model                                      # the base model: a_k needs no logits


def sl_a(model, ids):
    from sinklab.analysis.secondary import column_mean

    imp = model.run(ids, capture=("stats",), logits_from=-1, progress=False).stats.importance
    c = model.config
    return np.stack([column_mean(imp[l], c.layer_window(l)) for l in range(c.n_layers)])


def nvis_torch(T, window):
    import torch

    n = T - torch.arange(T, dtype=torch.float32)
    return torch.clamp(n, max=float(window)) if window else n


def hf_hook_a(base, ids, windows):
    """a_k from forward hooks on every attention module, one layer's probabilities at a time."""
    import torch

    T = ids.shape[-1]
    got = {}

    def hook(mod, _inp, out, l):
        got[l] = (out[1][0].sum(dim=-2) / nvis_torch(T, windows[l])).numpy()
        return (out[0], None)

    layers = base.layers
    hs = [layer.self_attn.register_forward_hook(lambda m, i, o, l=l: hook(m, i, o, l)) for l, layer in enumerate(layers)]
    try:
        with torch.inference_mode():
            base(input_ids=torch.from_numpy(ids)[None], use_cache=False)
    finally:
        for h in hs:
            h.remove()
    return np.stack([got[l] for l in range(len(layers))])


def hf_oa_a(base, ids, windows):
    import torch

    T = ids.shape[-1]
    with torch.inference_mode():
        out = base(input_ids=torch.from_numpy(ids)[None], use_cache=False, output_attentions=True)
    return np.stack([(a[0].sum(dim=-2) / nvis_torch(T, windows[l])).numpy() for l, a in enumerate(out.attentions)])


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--T", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--oa-max", type=int, default=1024)
    ap.add_argument("--sl-only", type=int, nargs="*", default=[])
    a = ap.parse_args()
    import torch
    import sinklab as sl
    from sinklab.analysis.secondary import long_sequences

    path = a.model or default_model()
    model = sl.load(path, quiet=True)
    base = load_hf(path)
    windows = [model.config.layer_window(l) for l in range(model.config.n_layers)]
    print(f"# model={os.path.basename(path)} cpu={cpu_name()} torch={torch.__version__} sinklab={sl.__version__} "
          f"simd={sl.simd()} repeats={a.repeats}")
    for ln in lscpu_lines():
        print("#", ln)
    print("| threads | T | sinklab median (min) s | hf hooks median (min) s | hf output_attentions median (min) s "
          "| hf hooks / sinklab | hf oa / sinklab | max rel diff of a_k |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.threads:
        sl.set_num_threads(n)
        torch.set_num_threads(n)
        for T in a.T:
            ids = long_sequences(model, T, 1, bool(model.tokenizer.add_bos_default))[0]
            runs = {"sl": lambda: sl_a(model, ids), "hf_hook": lambda: hf_hook_a(base, ids, windows)}
            if T <= a.oa_max:
                runs["hf_oa"] = lambda: hf_oa_a(base, ids, windows)
            times = {k: [] for k in runs}
            res = {}
            for k in runs:                                  # warm-up: weights paged in, workspaces allocated
                runs[k]()
            names = list(runs)
            for r in range(a.repeats):
                for k in names[r % len(names):] + names[:r % len(names)]:
                    t, res[k] = timed(runs[k])
                    times[k].append(t)
            ref = res["hf_hook"]
            diff = max(float(np.abs(res[k] - ref).max() / np.abs(ref).max()) for k in res if k != "hf_hook")
            med = {k: statistics.median(v) for k, v in times.items()}
            mn = {k: min(v) for k, v in times.items()}
            cell = lambda k: f"{med[k]:.3f} ({mn[k]:.3f})" if k in med else "—"  # noqa: E731
            ratio = lambda k: f"{med[k] / med['sl']:.2f}x" if k in med else "—"  # noqa: E731
            print(f"| {n} | {T} | {cell('sl')} | {cell('hf_hook')} | {cell('hf_oa')} | {ratio('hf_hook')} | "
                  f"{ratio('hf_oa')} | {diff:.1e} |", flush=True)
        for T in a.sl_only:
            ids = long_sequences(model, T, 1, bool(model.tokenizer.add_bos_default))[0]
            t, _ = timed(lambda: sl_a(model, ids))
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"| {n} | {T} | {t:.3f} (1 run) | — | — | — | — | process peak RSS so far {rss:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
