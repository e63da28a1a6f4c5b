#!/usr/bin/env python
"""Sink study with full attention capture: sinklab (batched) vs Hugging Face transformers (eager, fp32).

The workload (issue 9): the 144 shipped passages (``load_passages("sinks")``), each cut to 64
tokens with the BOS counted among them (what ``sink_study`` and the report run), every layer's
attention probabilities captured (what transformers' eager ``output_attentions=True`` gives), and
the first-token importance a_0 = mean_i A[i, 0] of every (prompt, layer, head) computed from them.

Contenders, timed alternately in one process (the order rotates every round), per thread count:
  sl_api   sinklab.analysis.sinkset.sink_study(model, ids, T=64, capture="attn"): the analysis
           API, which batches the prompts itself (sinklab.batching, 256 MiB cap: 57 a call)
  sl_run   bare model.run(ids[b:b+B], capture=("attn",)) in batches of B = --batch, a_0 in NumPy
  sl_loop  (--loop) model.run once per prompt, the way the analyses ran before batching
  hf       transformers' LlamaModel (the base model: no lm head, which the sink study does not
           need) on batches of B = --batch, output_attentions=True, use_cache=False, under
           torch.inference_mode(), attn_implementation="eager", torch.set_num_threads(n)
All get the same weights: transformers loads the same GGUF file (dequantized to fp32 by its GGUF
loader). The median and minimum over --repeats rounds are printed, and the ratio hf / sinklab.

Flop bound: 2 * (non-embedding weight parameters) * tokens for the weight GEMMs, plus the causal
Q K^T and A V products (2 * 2 * L * H * hd * T(T+1)/2 per prompt), divided by an SGEMM peak: by
default the best of sinklab's SGEMM and NumPy's matmul measured in this process (the method of
benchmarks/bench_sgemm.py: median of alternated blocks) on the shape (B*T) x 1536 x 576 (the MLP's
gate/up product), or --peak GFLOP/s per thread count from a bench_sgemm.py run. The bound is the
least time any fp32 implementation at that peak needs; hf time / bound is the best ratio possible.

Parity: on --check prompts, sinklab's attention against transformers' (max |diff| over every
layer, head and entry; the bound of tests/test_parity_smollm2.py is 1e-4 * max |reference|).

Usage:
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_sinkstudy.py \
      [--model PATH.gguf] [--threads 1,2] [--repeats 3] [--batch 16] [--T 64] [--loop] [--json OUT]
The model defaults to $SINKLAB_SMOLLM2_GGUF, else the registered smollm2-135m-instruct (fetched
into the sinklab cache).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
from machine import cpu_name

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def default_model():
    p = os.environ.get("SINKLAB_SMOLLM2_GGUF")
    if p:
        return p
    from sinklab.io import registry
    return str(registry.fetch("smollm2-135m-instruct", quiet=True))


def lscpu():
    """lscpu's model name and flags (the flags filtered to the SIMD ones), or []."""
    if not shutil.which("lscpu"):
        return [f"cpu: {cpu_name()}"]
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    lines = []
    for ln in out.splitlines():
        key = ln.split(":", 1)[0].strip()
        if key in ("Model name", "CPU(s)", "Thread(s) per core", "L1d cache", "L2 cache", "L3 cache"):
            lines.append(ln.strip())
        elif key == "Flags":
            simd = [f for f in ln.split(":", 1)[1].split() if f.startswith(("avx", "fma", "sse4", "f16c", "amx"))]
            lines.append("Flags (SIMD): " + " ".join(simd))
    return lines


def blas_info():
    try:
        from threadpoolctl import threadpool_info
        return [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        return "threadpoolctl not installed"


def prompt_ids(sl, model, T):
    """(P, T) int64: [BOS] + each shipped sink passage's first T-1 tokens (sink_study's rule)."""
    from sinklab.inputs import prepare, text_ids
    from sinklab.prompts import load_passages
    texts = load_passages("sinks")
    toks = [text_ids(model, t) for t in texts]
    return np.stack([prepare(model, x, True, T) for x in toks if len(x) >= T - 1]), toks


def a0_from_attn(A):
    """(B, L, H, T, T) -> (B, L, H) float64 mean attention to key 0 (all T queries see it)."""
    return A[..., :, 0].sum(axis=-1, dtype=np.float64) / A.shape[-1]


def make_contenders(sl, model, torch, hf, ids, toks, T, B):
    from sinklab.analysis import sinkset

    def sl_api():
        return sinkset.sink_study(model, [toks[i] for i in range(len(toks)) if len(toks[i]) >= T - 1],
                                  T=T, capture="attn", progress=False).importance

    def sl_run():
        return np.concatenate([a0_from_attn(model.run(ids[b:b + B], capture=("attn",), progress=False).attn)
                               for b in range(0, len(ids), B)])

    def sl_loop():
        return np.stack([a0_from_attn(model.run(ids[p:p + 1], capture=("attn",), progress=False).attn)[0]
                         for p in range(len(ids))])

    def hf_run():
        out = []
        with torch.inference_mode():
            for b in range(0, len(ids), B):
                att = hf.model(input_ids=torch.from_numpy(ids[b:b + B]), output_attentions=True,
                               use_cache=False).attentions
                out.append(np.stack([a0_from_attn(a.numpy()) for a in att], axis=1))
        return np.concatenate(out)

    return {"sl_api": sl_api, "sl_run": sl_run, "sl_loop": sl_loop, "hf": hf_run}


def flops(model, n_prompts, T):
    """(weight-GEMM flop, attention flop) of the sink study: no embedding, no lm head."""
    c = model.config
    params = sum(int(np.prod(w.shape)) for k, w in model.weights.items()
                 if w.ndim == 2 and k not in ("tok_embd", "lm_head"))
    gemm = 2.0 * params * n_prompts * T
    attn = 2.0 * 2.0 * c.n_layers * c.n_heads * c.head_dim * (T * (T + 1) / 2) * n_prompts
    return gemm, attn, params


def sgemm_peak(core, rows, threads, reps=9):
    """GFLOP/s (median of alternated blocks) of sinklab's SGEMM and of NumPy on rows x 1536 x 576,
    both on ``threads`` threads (NumPy's BLAS limited through threadpoolctl when installed)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return _sgemm_peak(core, rows, reps)
    with threadpool_limits(limits=threads, user_api="blas"):
        return _sgemm_peak(core, rows, reps)


def _sgemm_peak(core, rows, reps):
    rng = np.random.default_rng(0)
    M, N, K = rows, 1536, 576
    A = rng.standard_normal((M, K), dtype=np.float32)
    W = rng.standard_normal((N, K), dtype=np.float32)
    C1, C2 = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    fs = {"sinklab": lambda: core.sgemm(A, W, C1, trans_a=False, trans_b=True),
          "numpy": lambda: np.matmul(A, W.T, out=C2)}
    ts = {k: [] for k in fs}
    for f in fs.values():
        f(), f()
    for _ in range(3):
        for k, f in fs.items():
            time.sleep(0.2)
            for _ in range(-(-reps // 3)):
                t0 = time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t0)
    return {k: 2.0 * M * N * K / statistics.median(t) / 1e9 for k, t in ts.items()}


def parity(model, torch, hf, ids, n):
    """max |attn_sinklab - attn_hf| and max |attn_hf| over the first n prompts (one batch)."""
    tr = model.run(ids[:n], capture=("attn",), progress=False)
    with torch.inference_mode():
        att = hf.model(input_ids=torch.from_numpy(ids[:n]), output_attentions=True, use_cache=False).attentions
    ref = np.stack([a.numpy() for a in att], axis=1).astype(np.float64)    # (n, L, H, T, T)
    return float(np.max(np.abs(tr.attn - ref))), float(np.max(np.abs(ref)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--loop", action="store_true", help="also time one model.run per prompt")
    ap.add_argument("--check", type=int, default=4, help="prompts compared with transformers")
    ap.add_argument("--peak", default="", help="SGEMM GFLOP/s per thread count, e.g. 235,450")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import torch
    import transformers
    import sinklab as sl
    from sinklab import _core as core

    path = args.model or default_model()
    print("\n".join(lscpu()))
    print(f"python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, sinklab simd {sl.simd()}")
    print(f"BLAS: {blas_info()}")
    print(f"load: {os.getloadavg()}")
    model = sl.load(path, quiet=True)
    transformers.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="eager")
    hf.eval()
    ids, toks = prompt_ids(sl, model, args.T)
    P, T, B = len(ids), args.T, args.batch
    print(f"workload: {P} prompts x {T} tokens, full attention capture; batch B = {B} (sl_run, hf)")
    gemm, attn, params = flops(model, P, T)
    print(f"flop: weight GEMMs 2 x {params:,} x {P * T} tokens = {gemm / 1e9:.1f} GFLOP, "
          f"causal attention {attn / 1e9:.1f} GFLOP")
    err, scale = parity(model, torch, hf, ids, args.check)
    print(f"parity on {args.check} prompts: max |attn - attn_hf| = {err:.2e} "
          f"(bound 1e-4 x max|ref| = {1e-4 * scale:.2e}): {'ok' if err <= 1e-4 * scale else 'FAIL'}")
    peaks = [float(x) for x in args.peak.split(",") if x]
    results = {"lscpu": lscpu(), "P": P, "T": T, "B": B, "gflop": (gemm + attn) / 1e9,
               "parity_max_abs": err, "rows": []}
    names = ["sl_api", "sl_run", "hf"] + (["sl_loop"] if args.loop else [])
    for k, n in enumerate(int(x) for x in args.threads.split(",")):
        sl.set_num_threads(n)
        torch.set_num_threads(n)
        fs = make_contenders(sl, model, torch, hf, ids, toks, T, B)
        ref = fs["hf"]()                       # warm-up, and the a_0 every contender must give
        for name in names:
            got = fs[name]()
            d = float(np.max(np.abs(got - ref)))
            print(f"  {n} thread(s) {name}: max |a_0 - a_0(hf)| = {d:.2e}")
        ts = {name: [] for name in names}
        for r in range(args.repeats):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                t0 = time.perf_counter()
                fs[name]()
                ts[name].append(time.perf_counter() - t0)
            print(f"  {n} thread(s) round {r}: " + ", ".join(f"{x} {ts[x][-1]:.2f} s" for x in names)
                  + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
        if k < len(peaks):
            peak = peaks[k]
        else:
            gf = sgemm_peak(core, B * T, n)
            peak = max(gf.values())
            print(f"{n} thread(s): SGEMM {B * T}x1536x576 GFLOP/s: " + ", ".join(f"{a} {v:.0f}" for a, v in gf.items()))
        bound = (gemm + attn) / (peak * 1e9)
        hf_med = statistics.median(ts["hf"])
        print(f"{n} thread(s): SGEMM peak {peak:.0f} GFLOP/s -> flop bound {bound:.2f} s "
              f"(best possible ratio vs hf {hf_med / bound:.2f}x)")
        for name in names:
            med, best = statistics.median(ts[name]), min(ts[name])
            row = {"threads": n, "who": name, "median_s": med, "min_s": best,
                   "ratio_hf_over": hf_med / med, "gflops": (gemm + attn) / med / 1e9,
                   "of_peak": bound / med, "peak_gflops": peak, "times": ts[name]}
            results["rows"].append(row)
            print(f"  {name:8s} median {med:6.2f} s  min {best:6.2f} s  hf/this {hf_med / med:5.2f}x  "
                  f"{row['gflops']:6.1f} GFLOP/s ({100 * row['of_peak']:.0f} % of peak)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
