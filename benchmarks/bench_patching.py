"""Activation patching: (a) what a patch costs a forward, (b) the patching experiment against the
same computation in transformers (fp32 eager) with forward hooks, same threads, one process.

    python benchmarks/bench_patching.py [--threads 2] [--T 512] [--reps 5] [--pairs 2] [--batch 64]

(a) SmolLM2-135M fp32, last-position logits, T tokens: a plain forward alternated with forwards
    carrying one patch of each kind (median of --reps): resid at one layer on every position,
    z on 3 heads, head_out replaced on one head (an extra (T x hd)·(hd x d) product per patched
    head), q on one head (RoPE then leaves the attention's parallel region), pattern on one head.
(b) sl.patching_experiment over resid per (layer, position) on --pairs IOI name-swap pairs,
    every layer, vs transformers: its clean run's hidden states, then the same cells in batches of
    --batch rows, each row's patch done by a forward pre-hook on the decoder layer (one hook per
    layer, rows looked up by layer), logits of the last position only (logits_to_keep=1); both
    include their clean and corrupted runs. The two grids of logit differences are compared.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # the transformers reference loader lives in tests/support
    sys.path.insert(0, _ROOT)


def lscpu():
    from machine import cpu_name, lscpu_lines

    return [f"cpu: {cpu_name()}"] + lscpu_lines()


def bench_forward(model, T, reps):
    from sinklab.patching import Patch

    c = model.config
    rng = np.random.default_rng(0)
    ids = rng.integers(3, c.vocab_size, T)
    ids[0] = c.bos_token_id or 1
    tr = model.run(ids, capture=("resid", "z"), layers=[12], progress=False)
    kinds = {
        "plain": None,
        "resid (layer 12, all T positions)": [Patch("resid", tr.resid[12], layer=12)],
        "z (layer 12, 3 heads, all positions)": [Patch("z", tr.z[0, :3], layer=12, heads=[0, 1, 2])],
        "head_out replace (layer 12, 1 head)": [Patch("head_out", np.zeros((1, T, c.d_model)), layer=12, heads=[4])],
        "q (layer 12, 1 head)": [Patch("q", np.zeros((1, T, c.head_dim)), layer=12, heads=[2])],
        "pattern (layer 12, 1 head)": [Patch("pattern", (np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None])[None],
                                             layer=12, heads=[1])],
    }
    times = {k: [] for k in kinds}
    for k, p in kinds.items():  # warm-up
        model.run(ids, capture=("logits",), logits_from=-1, patch=p, progress=False)
    for _ in range(reps):
        for k, p in kinds.items():
            t = time.perf_counter()
            model.run(ids, capture=("logits",), logits_from=-1, patch=p, progress=False)
            times[k].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n(a) forward with and without a patch, T={T}, median of {reps}")
    print(f"{'patch':<40}{'median s':>10}{'/ plain':>10}")
    for k in kinds:
        print(f"{k:<40}{med[k]:>10.4f}{med[k] / med['plain']:>9.3f}x")
    return med


def hf_experiment(hf, clean, corr, ans, wr, batch):
    import torch

    layers = hf.model.layers
    L, (N, T) = len(layers), clean.shape
    with torch.no_grad():
        out = hf(input_ids=torch.as_tensor(clean), output_hidden_states=True, use_cache=False, logits_to_keep=1)
        hs = out.hidden_states  # (L+1) x (N, T, d); hs[l] enters layer l for l < L
        ld_clean = (out.logits[:, -1, :].double().numpy())
        ld_corr = hf(input_ids=torch.as_tensor(corr), use_cache=False, logits_to_keep=1).logits[:, -1, :].double().numpy()
    r = np.arange(N)
    ld_c, ld_k = ld_clean[r, ans] - ld_clean[r, wr], ld_corr[r, ans] - ld_corr[r, wr]
    cells = [(n, l, p) for n in range(N) for l in range(L) for p in range(T)]
    patched = np.empty((N, L, T))
    state = {}

    def pre(l):
        def hook(_mod, args, kwargs):
            rows = state.get(l)
            if not rows:
                return None
            h = (args[0] if args else kwargs["hidden_states"]).clone()
            for row, n, p in rows:
                h[row, p] = hs[l][n, p]
            if args:
                return (h,) + tuple(args[1:]), kwargs
            return args, dict(kwargs, hidden_states=h)
        return hook

    handles = [blk.register_forward_pre_hook(pre(l), with_kwargs=True) for l, blk in enumerate(layers)]
    try:
        for s in range(0, len(cells), batch):
            chunk = cells[s:s + batch]
            state.clear()
            for row, (n, l, p) in enumerate(chunk):
                state.setdefault(l, []).append((row, n, p))
            ids = corr[[n for n, _, _ in chunk]]
            with torch.no_grad():
                lg = hf(input_ids=torch.as_tensor(ids), use_cache=False, logits_to_keep=1).logits[:, -1, :].double().numpy()
            for row, (n, l, p) in enumerate(chunk):
                patched[n, l, p] = lg[row, ans[n]] - lg[row, wr[n]]
    finally:
        for h in handles:
            h.remove()
    return patched, ld_c, ld_k


def bench_experiment(model, gguf, pairs, batch):
    import sinklab as sl
    from tests.support.reference_models import hf_gguf_reference

    hf, _ = hf_gguf_reference(str(gguf))
    clean, corr, ans, wr = sl.name_swap_pairs(model, pairs)
    t = time.perf_counter()
    res = sl.patching_experiment(model, clean, corr, ans, wr, over="resid", batch=batch, progress=False)
    t_sl = time.perf_counter() - t
    t = time.perf_counter()
    ref, ld_c, ld_k = hf_experiment(hf, clean, corr, ans, wr, batch)
    t_hf = time.perf_counter() - t
    n_runs = res.recovered.size
    err = float(np.abs(res.patched_diff - ref).max())
    print(f"\n(b) patching experiment: resid per (layer, position), {pairs} pairs x {len(res.layers)} layers x "
          f"{res.T} positions = {n_runs} patched runs, batches of {batch}")
    print(f"sinklab  {t_sl:8.2f} s  ({n_runs / t_sl:7.1f} patched runs/s)")
    print(f"HF+hooks {t_hf:8.2f} s  ({n_runs / t_hf:7.1f} patched runs/s)")
    print(f"HF / sinklab time: {t_hf / t_sl:.2f}x   (target >= 1.00x)")
    print(f"max |logit diff sinklab - HF| over the grid: {err:.2e} (largest |logit diff| "
          f"{float(np.abs(ref).max()):.2f}); clean {np.round(res.clean_diff, 4)} vs {np.round(ld_c, 4)}")
    return t_sl, t_hf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--no-experiment", action="store_true")
    a = ap.parse_args()
    import torch

    import sinklab as sl
    from sinklab.io import registry

    sl.set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    gguf = registry.fetch("smollm2-135m-instruct")
    model = sl.load(str(gguf), quiet=True)
    print("\n".join(lscpu()))
    print(f"sinklab {sl.__version__}, simd {sl.simd()}, threads {a.threads} (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    bench_forward(model, a.T, a.reps)
    if not a.no_experiment:
        bench_experiment(model, gguf, a.pairs, a.batch)


if __name__ == "__main__":
    main()
