#!/usr/bin/env python
"""Sink-head ablation and sinks across documents vs the same computation in transformers + hooks
(issue 25, the last two speed rows).

Two analyses, with the quick report's settings (``settings(True)`` of
``sinklab/report/beyond_ablation.py`` and ``beyond_multidoc.py``):

  ablation  ``sl.head_ablation(model, passages[:6], T=64, n_top=8, draws=8, eps=0.3)``: a_0 per
            head on the unablated model, the top sink heads and 8 matched random draws of
            non-sink heads switched off (``head_scale`` 0), NLL and top-1 accuracy per prompt
            for each of the 10 conditions (60 forwards of T = 64 with logits).
  multidoc  ``sl.multidoc_sinks(model, n_docs=4, doc_tokens=96, n_prompts=8, eps=0.3)``: 8
            sequences of 4 passages x 96 tokens, with the model's ⟨bos⟩ id before every document
            after the first and without; per (prompt, layer, head) Gu's a at position 0, at the
            later documents' starts, after each separator and over the other keys, the sink
            fraction over the other keys, and the attention-mass shares on position 0 and on the
            starts.

The alternative is what a researcher would write with transformers (fp32, eager attention,
``torch.inference_mode()``, all prompts of a condition in one batch). ablation: the same prompts
(the module's own ``sequences`` builder with the analysis' ⟨bos⟩ rule) and exactly the head sets
the sinklab result used (``sink_heads``, ``random_heads`` read from it); the unablated run with a
forward hook on every attention module taking a_0 from its attention weights, then per
condition a forward pre-hook on every ``o_proj`` that zeroes the ablated heads' input slices;
NLL (cross-entropy on fp32 logits) and accuracy per prompt. multidoc: the same token ids (the
sinklab result's ``data[cond]["ids"]`` and ``starts``), the base model (no LM head: sinklab keeps
only the last row of logits) with a forward hook on every attention module summing its weights
over queries in float64 (column mass m_k), then a_k = m_k / (queries that see k, from the
layer's sliding window) and the same statistics in torch float64.

Tokenization is inside the sinklab call's time, not the alternative's (it gets the ids). The
same weights on both sides (transformers' GGUF loader dequantizes the same file, read from the
tests' reference cache). Per thread count N, ``sl.set_num_threads(N)``, ``torch.set_num_threads(N)``
and NumPy's BLAS limited to N (threadpoolctl); the contenders alternate in one process, the order
rotating each round; median and min over --repeats after one warm-up round.

Agreement (printed, so that the two are the same computation): ablation: a_0 (max abs), whether
the HF a_0 picks the same sink heads, NLL and accuracy per (condition, prompt); multidoc: every
per-(prompt, layer, head) array (max abs), the sink fraction over the other keys.

Usage:
  python benchmarks/bench_beyond2.py [--models smollm2-135m-instruct,gemma-3-270m] [--threads 1,2]
      [--analyses ablation,multidoc] [--repeats 3] [--profile] [--json OUT]
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (_ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench_beyond import blas_limit, model_run_timer, profile, report  # noqa: E402
from machine import cpu_name, lscpu_lines  # noqa: E402


# ---------------------------------------------------------------------------------- HF side
def attn_of(hf):
    return [layer.self_attn for layer in hf.model.layers]


def hf_nll_acc(torch, logits, ids):
    """(P,) mean next-token NLL (nats) and top-1 accuracy per prompt from fp32 logits (P, T, V)."""
    z, t = logits[:, :-1], ids[:, 1:]
    nll = torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), reduction="none")
    nll = nll.view(t.shape).double().mean(1)
    acc = (z.argmax(-1) == t).double().mean(1)
    return nll.numpy(), acc.numpy()


def hf_ablation(torch, hf, ids, sink_heads, random_heads):
    """a_0 (L, H) of the unablated model and NLL / accuracy per condition (base, sink, random_d)
    and prompt, heads switched off by zeroing their slice of o_proj's input."""
    mods = attn_of(hf)
    L = len(mods)
    a0 = [None] * L
    off = {}                                                          # layer -> heads to zero now

    def grab_a0(l):
        def hook(_m, _i, out):
            a0[l] = out[1][..., :, 0].double().mean(-1).sum(0)        # (H,), summed over prompts
        return hook

    def zero_heads(l, m):
        def hook(_m, args):
            hs = off.get(l)
            if hs is None:
                return None
            x = args[0].clone()
            x.view(*x.shape[:-1], -1, m.head_dim)[..., hs, :] = 0.0
            return (x,)
        return hook

    x = torch.from_numpy(ids)
    hs = [m.register_forward_hook(grab_a0(l)) for l, m in enumerate(mods)]
    nll, acc = [], []
    try:
        with torch.inference_mode():
            n, a = hf_nll_acc(torch, hf(input_ids=x, use_cache=False).logits, x)
            nll.append(n)
            acc.append(a)
            for h in hs:
                h.remove()
            hs = [m.o_proj.register_forward_pre_hook(zero_heads(l, m)) for l, m in enumerate(mods)]
            for heads in [sink_heads] + list(random_heads):
                off.clear()
                for l in np.unique(heads[:, 0]):
                    off[int(l)] = torch.from_numpy(heads[heads[:, 0] == l, 1])
                n, a = hf_nll_acc(torch, hf(input_ids=x, use_cache=False).logits, x)
                nll.append(n)
                acc.append(a)
    finally:
        for h in hs:
            h.remove()
    return {"a0": torch.stack(a0).numpy() / len(ids), "nll": np.stack(nll), "acc": np.stack(acc)}


def layer_windows(hf):
    """Each layer's sliding window (0: none) from the HF config."""
    c = hf.config
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    w = getattr(c, "sliding_window", None) or 0
    return [int(w) if t == "sliding_attention" else 0 for t in types]


def hf_multidoc(torch, hf, conds, eps, min_queries):
    """Per condition the multidoc arrays from the attention weights' column sums, torch float64.
    ``conds``: {cond: (ids (P, T), starts (n-1,), separated)}."""
    mods = attn_of(hf)
    mass = [None] * len(mods)

    def grab(l):
        def hook(_m, _i, out):
            mass[l] = out[1].double().sum(-2)                         # (P, H, T): m_k = sum_i A[i, k]
        return hook

    windows = layer_windows(hf)
    hs = [m.register_forward_hook(grab(l)) for l, m in enumerate(mods)]
    res = {}
    try:
        with torch.inference_mode():
            for cond, (ids, starts, sep) in conds.items():
                hf.model(input_ids=torch.from_numpy(ids), use_cache=False)
                T = ids.shape[1]
                i = torch.arange(T)
                st = torch.from_numpy(starts)
                special = torch.zeros(T, dtype=torch.bool)
                special[0] = True
                special[st] = True
                if sep:
                    special[st + 1] = True
                rest = ~special & (i <= T - min_queries)
                out = {k: [] for k in ("a0", "a_start", "a_after", "a_rest", "rest_rate", "mass_first",
                                       "mass_starts")}
                for l, m in enumerate(mass):
                    see = (i[:, None] >= i[None, :])                  # query i sees key k
                    if windows[l]:
                        see &= (i[:, None] - i[None, :]) < windows[l]
                    a = m / see.sum(0).double()                       # (P, H, T)
                    out["a0"].append(a[..., 0])
                    out["a_start"].append(a[..., st].movedim(-1, 1))  # (P, n-1, H)
                    out["a_after"].append(a[..., st + 1].movedim(-1, 1) if sep
                                          else torch.full_like(a[..., st].movedim(-1, 1), float("nan")))
                    out["a_rest"].append(a[..., rest].mean(-1))
                    out["rest_rate"].append((a[..., rest] > eps).double().mean(-1))
                    out["mass_first"].append(m[..., 0] / T)
                    out["mass_starts"].append(m[..., st].sum(-1) / T)
                res[cond] = {k: torch.stack(v, -2).numpy() for k, v in out.items()}    # (P, [n-1,] L, H)
    finally:
        for h in hs:
            h.remove()
    return res


# ---------------------------------------------------------------------------------- agreement
def agree_ablation(sl, r, h):
    from sinklab.analysis.head_ablation import top_sink_heads

    nl = np.concatenate([r.nll_base[None], r.nll_sink[None], r.nll_random])
    ac = np.concatenate([r.acc_base[None], r.acc_sink[None], r.acc_random])
    return {"n_sink_heads": int(len(r.sink_heads)), "n_sink_total": [r.n_sink_total, int((h["a0"] > r.eps).sum())],
            "a0_max_abs": float(np.abs(r.a0 - h["a0"]).max()),
            "same_sink_heads": bool(np.array_equal(top_sink_heads(h["a0"], r.eps, len(r.sink_heads)), r.sink_heads)),
            "nll_max_abs": float(np.abs(nl - h["nll"]).max()), "nll_mean": float(nl.mean()),
            "dnll_sink_max_abs": float(np.abs((nl[1] - nl[0]) - (h["nll"][1] - h["nll"][0])).max()),
            "acc_max_abs": float(np.abs(ac - h["acc"]).max())}


def agree_multidoc(r, h):
    out = {}
    for c in ("separated", "concatenated"):
        d, e = r.data[c], h[c]
        for k in ("a0", "a_start", "a_after", "a_rest", "mass_first", "mass_starts"):
            if c == "concatenated" and k == "a_after":
                continue
            out[f"{c}.{k}_max_abs"] = float(np.abs(d[k] - e[k]).max())
        out[f"{c}.rest_rate_max_abs"] = float(np.abs(d["rest_rate"] - e["rest_rate"]).max())
    out["T"] = {c: int(r.data[c]["ids"].shape[1]) for c in ("separated", "concatenated")}
    return out


# ---------------------------------------------------------------------------------- bench
def bench_model(sl, torch, name, threads, repeats, analyses, do_profile):
    from sinklab.analysis.massive import sequences
    from sinklab.io import registry
    from sinklab.prompts import load_passages
    from sinklab.report import beyond_ablation, beyond_multidoc
    from tests.support.reference_models import hf_gguf_model

    sa, sm = beyond_ablation.settings(True), beyond_multidoc.settings(True)
    eps_a, eps_m = beyond_ablation.EPS, beyond_multidoc.EPS
    path = str(registry.fetch(name, quiet=True))
    model = sl.load(path, quiet=True)
    hf = hf_gguf_model(path)
    hf.config._attn_implementation = "eager"
    passages = load_passages("sinks")[: sa["n_prompts"]]
    print(f"\n== {model.name}: L = {model.config.n_layers}, H = {model.config.n_heads}, d = {model.config.d_model}, "
          f"vocab {model.config.vocab_size}; ablation {sa}, multidoc {sm}")

    fs = {}
    if "ablation" in analyses:
        # the analysis' own bos rule (head_ablation's default)
        bos_a = bool(getattr(model.tokenizer, "add_bos_default", False)) and model.config.bos_token_id is not None

        def sl_ablation():
            return sl.head_ablation(model, passages, T=sa["T"], n_top=sa["n_top"], draws=sa["draws"], eps=eps_a,
                                    progress=False)
        ra = sl_ablation()
        assert ra.bos == bos_a, (ra.bos, bos_a)
        ids_a, _, _ = sequences(model, passages, sa["T"], bos_a, skip_short=True)
        print(f"  ablation: {len(ids_a)} prompts x T = {ids_a.shape[1]}, bos={bos_a}, {len(ra.sink_heads)} sink "
              f"heads {ra.sink_heads.tolist()}, {len(ra.random_heads)} draws")
        fs["sl_ablation"] = sl_ablation
        fs["hf_ablation"] = lambda: hf_ablation(torch, hf, ids_a, ra.sink_heads, ra.random_heads)
    if "multidoc" in analyses:
        def sl_multidoc():
            return sl.multidoc_sinks(model, n_docs=sm["n_docs"], doc_tokens=sm["doc_tokens"],
                                     n_prompts=sm["n_prompts"], eps=eps_m, progress=False)
        rm = sl_multidoc()
        conds = {c: (rm.data[c]["ids"], rm.data[c]["starts"], c == "separated") for c in ("separated", "concatenated")}
        print(f"  multidoc: {rm.n_prompts} prompts, T = {[v[0].shape[1] for v in conds.values()]}, bos={rm.bos}, "
              f"separator {rm.sep_token!r} ({rm.sep_id}), windows {sorted(set(rm.windows))}")
        fs["sl_multidoc"] = sl_multidoc
        fs["hf_multidoc"] = lambda: hf_multidoc(torch, hf, conds, eps_m, rm.min_queries)
    rows = []
    for n in threads:
        sl.set_num_threads(n)
        torch.set_num_threads(n)
        with blas_limit(n):
            outs = {k: f() for k, f in fs.items()}                    # warm-up and agreement
            agree = {}
            if "ablation" in analyses:
                agree["ablation"] = agree_ablation(sl, outs["sl_ablation"], outs["hf_ablation"])
            if "multidoc" in analyses:
                agree["multidoc"] = agree_multidoc(outs["sl_multidoc"], outs["hf_multidoc"])
            for an, ag in agree.items():
                print(f"  {n} thread(s) agreement, {an}: {json.dumps(ag)}")
            del outs
            ts = {k: [] for k in fs}
            names = list(fs)
            for r in range(repeats):
                order = names[r % len(names):] + names[:r % len(names)]
                for k in order:
                    t0 = time.perf_counter()
                    fs[k]()
                    ts[k].append(time.perf_counter() - t0)
                print(f"  {n} thread(s) round {r}: " + ", ".join(f"{k} {ts[k][-1]:.2f} s" for k in names)
                      + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
            for an in agree:
                ms, mh = statistics.median(ts["sl_" + an]), statistics.median(ts["hf_" + an])
                row = {"model": model.name, "analysis": an, "threads": n, "sl_median_s": ms,
                       "hf_median_s": mh, "sl_min_s": min(ts["sl_" + an]), "hf_min_s": min(ts["hf_" + an]),
                       "ratio_hf_over_sl": mh / ms, "sl_s": ts["sl_" + an], "hf_s": ts["hf_" + an],
                       "agreement": agree[an]}
                rows.append(row)
                print(f"  {n} thread(s) {an:8s}: sinklab median {ms:6.2f} s (min {row['sl_min_s']:.2f}), "
                      f"transformers median {mh:6.2f} s (min {row['hf_min_s']:.2f}): hf/sinklab {mh / ms:.2f}x")
            if do_profile:
                for an in agree:
                    t0 = time.perf_counter()
                    with model_run_timer(model) as mt:
                        fs["sl_" + an]()
                    tot = time.perf_counter() - t0
                    print(f"  {n} thread(s) sl_{an}: total {tot:.2f} s, of which model.run {mt['s']:.2f} s "
                          f"({100 * mt['s'] / tot:.0f} %)")
                    print(profile(fs["sl_" + an]))
    del hf
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--analyses", default="ablation,multidoc")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile each sinklab call once per thread count")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    analyses = a.analyses.split(",")
    bad = set(analyses) - {"ablation", "multidoc"}
    if bad:
        ap.error(f"unknown analyses {sorted(bad)}")

    import torch
    import transformers
    import sinklab as sl

    print(f"CPU: {cpu_name()}")
    for ln in lscpu_lines():
        print("  " + ln)
    print(f"numpy {np.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"sinklab simd {sl.simd()}; load average at start {os.getloadavg()}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    transformers.logging.set_verbosity_error()
    rows = []
    for name in a.models.split(","):
        rows += bench_model(sl, torch, name, [int(x) for x in a.threads.split(",")], a.repeats, analyses, a.profile)
    print(f"\nload average at end {os.getloadavg()}; {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    report(rows, a.json)


if __name__ == "__main__":
    main()
