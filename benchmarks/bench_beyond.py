#!/usr/bin/env python
"""Beyond-the-paper analyses vs the same computation in transformers + hooks (issue 25, speed rows).

Two analyses, with the quick report's settings (``sinklab/report/beyond_massive.py`` and
``beyond_key_geometry.py`` ``settings(True)``: the first 16 shipped "sinks" passages, T = 64,
the model's own BOS rule, prompts shorter than T left out):

  massive   ``sl.massive_activations(model, passages, T=64, bos=..., skip_short=True)``:
            per residual stream the 8 largest |x| (values, positions, dimensions), the median
            |x|, the norms at position 0 and after, the attention and MLP outputs' norms at
            position 0, the jump layer and its writer, and the jump layer's MLP neurons
            recomputed in float64 (contributions, shares, activations).
  keygeom   ``sl.key_geometry(model, passages, T=64, bos=..., skip_short=True)``: per (prompt,
            layer, head) the norm / angle split of the sink logit gap from q and k after RoPE,
            and the first-token importance a_0.

The alternative is what a researcher would write with transformers (fp32, eager attention,
``torch.inference_mode()``, all prompts in one batch): for ``massive``, ``output_hidden_states``
plus a forward hook on the last decoder layer (HF's last hidden state is after the final norm)
and hooks on the blocks whose outputs are added to the stream (``self_attn`` / ``mlp`` for
LLaMA; ``post_attention_layernorm`` / ``post_feedforward_layernorm`` for Gemma 3), then the same
statistics in torch float64 and the neuron recomputation in float64 from the HF modules'
weights; for ``keygeom``, a forward pre-hook on every attention module that recomputes q and k
from its input with its own ``q_proj`` / ``k_proj`` (+ ``q_norm`` / ``k_norm``) and the modeling
file's ``apply_rotary_pos_emb``, a forward hook taking its attention weights for a_0, then the
split in torch float64.

Both get the same token ids (sinklab's ``sequences``; tokenization is inside the sinklab call's
time, not the alternative's) and the same weights (transformers' GGUF loader dequantizes the same
file, read from the tests' reference cache). Per thread count N, ``sl.set_num_threads(N)``,
``torch.set_num_threads(N)`` and NumPy's BLAS limited to N (threadpoolctl); the contenders
alternate in one process, the order rotating each round; median and min over --repeats.

Agreement (printed, so that the two are the same computation): per stream the top/median ratio
(max relative difference), the jump layer, writer and neuron ids, the neuron shares; per head
the norm share, the gap and a_0 (max abs differences).

Usage:
  python benchmarks/bench_beyond.py [--models smollm2-135m-instruct,gemma-3-270m] [--threads 1,2]
      [--repeats 3] [--profile] [--bare] [--json OUT]
"""
import argparse
import copy
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (_ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

from machine import cpu_name, lscpu_lines  # noqa: E402


def blas_limit(n):
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(limits=n, user_api="blas")
    except ImportError:
        return nullcontext()


# ---------------------------------------------------------------------------------- HF side
def blocks(layer):
    """(attention block whose output is added to the stream, MLP block likewise, the MLP's input
    norm, the MLP's output norm or None) of one HF decoder layer."""
    if hasattr(layer, "post_feedforward_layernorm"):                     # Gemma 2/3: sandwich norms
        return (layer.post_attention_layernorm, layer.post_feedforward_layernorm,
                layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)
    return layer.self_attn, layer.mlp, layer.post_attention_layernorm, None


def hf_massive(torch, hf, ids, top=8, n_neurons=5):
    """The massive-activations numbers from transformers + hooks, torch float64."""
    layers = hf.model.layers
    L = len(layers)
    got = {"attn": [None] * L, "mlp": [None] * L}

    def grab(kind, l):
        def hook(_m, _i, out):
            got[kind][l] = (out[0] if isinstance(out, tuple) else out)[:, 0].double()
        return hook

    def grab_last(_m, _i, out):
        got["last"] = out[0] if isinstance(out, tuple) else out

    hs = [layers[-1].register_forward_hook(grab_last)]
    for l, layer in enumerate(layers):
        a, m, _, _ = blocks(layer)
        hs += [a.register_forward_hook(grab("attn", l)), m.register_forward_hook(grab("mlp", l))]
    try:
        with torch.inference_mode():
            out = hf.model(input_ids=torch.from_numpy(ids), output_hidden_states=True, use_cache=False)
            x = torch.stack(list(out.hidden_states[:L]) + [got["last"]], 1).double()    # (P, S, T, d)
            P, S, T, d = x.shape
            a = x.abs().reshape(P, S, -1)
            tv, idx = a.topk(top, dim=-1)
            tv = torch.gather(x.reshape(P, S, -1), -1, idx)
            # NumPy's partition-based median (torch.quantile sorts: 2 s of the 7 s on SmolLM2)
            med = torch.from_numpy(np.median(a.numpy(), axis=-1))
            norms = x.norm(dim=-1)
            bn, on = norms[..., 0], norms[..., 1:].mean(-1)
            ao, mo = torch.stack(got["attn"], 1), torch.stack(got["mlp"], 1)          # (P, L, d)
            an, mn = ao.norm(dim=-1), mo.norm(dim=-1)
            jl = int((bn[:, 1:] / bn[:, :-1]).mean(0).argmax())
            writer = "mlp" if mn[:, jl].mean() >= an[:, jl].mean() else "attn"
            _, _, pre, post = blocks(layers[jl])
            mlp = layers[jl].mlp
            Wg, Wu, Wd = (w.weight.double() for w in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
            pre64 = copy.deepcopy(pre).double()                       # a float64 copy: the model stays fp32
            u = pre64(x[:, jl, 0] + ao[:, jl])                               # (P, d)
            act = mlp.act_fn(u @ Wg.T) * (u @ Wu.T)                              # (P, F)
            C = act[:, :, None] * Wd.T[None]                                     # (P, F, d)
            if post is not None:
                tot = C.sum(1)
                C = C * (copy.deepcopy(post).double()(tot) / tot)[:, None, :]
            m = mo[:, jl]
            shares = torch.einsum("pfd,pd->pf", C, m) / (m * m).sum(-1, keepdim=True)
            cn = C.norm(dim=-1)
            nz = cn.mean(0).argsort(descending=True, stable=True)[:n_neurons]
            check = float(((C.sum(1) - m).norm(dim=-1) / m.norm(dim=-1)).max())
    finally:
        for h in hs:
            h.remove()
    return {"top_ratio": (tv[..., 0].abs() / med).numpy(), "top_pos": (idx // d).numpy(),
            "top_dim": (idx % d).numpy(), "bos_norm": bn.numpy(), "other_norm": on.numpy(),
            "jump_layer": jl, "writer": writer, "neurons": nz.numpy(), "neuron_share": shares[:, nz].numpy(),
            "neuron_check": check}


def hf_keygeom(torch, hf, ids):
    """The key-geometry numbers from transformers + hooks (q, k after RoPE recomputed from each
    attention module's input), torch float64."""
    layers = hf.model.layers
    L = len(layers)
    qs, ks, a0 = [None] * L, [None] * L, [None] * L

    def pre(l):
        def hook(m, args, kw):
            h = kw["hidden_states"] if "hidden_states" in kw else args[0]
            cos, sin = kw["position_embeddings"] if "position_embeddings" in kw else args[1]
            shp = (*h.shape[:-1], -1, m.head_dim)
            q = m.q_proj(h).view(shp).transpose(1, 2)
            k = m.k_proj(h).view(shp).transpose(1, 2)
            if hasattr(m, "q_norm"):
                q, k = m.q_norm(q), m.k_norm(k)
            rope = sys.modules[type(m).__module__].apply_rotary_pos_emb
            qs[l], ks[l] = rope(q, k, cos, sin)
        return hook

    def post(l):
        def hook(_m, _i, out):
            a0[l] = out[1][..., :, 0].double().mean(-1)                  # (P, H), all T queries
        return hook

    hs = []
    for l, layer in enumerate(layers):
        hs += [layer.self_attn.register_forward_pre_hook(pre(l), with_kwargs=True),
               layer.self_attn.register_forward_hook(post(l))]
    try:
        with torch.inference_mode():
            hf.model(input_ids=torch.from_numpy(ids), use_cache=False)
            T = ids.shape[1]
            i = torch.arange(T)
            pair = i[None, :] <= i[:, None]
            pair[0, :] = False
            pair[:, 0] = False
            pair = pair.double()
            npair = pair.sum()
            out = {k: [] for k in ("norm_share", "gap", "k0_norm")}
            for l in range(L):
                m = layers[l].self_attn
                q, k = qs[l].double(), ks[l].double()                    # (P, H, T, hd), (P, G, T, hd)
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                s = m.scaling
                qn, kn = q.norm(dim=-1), k.norm(dim=-1)
                dots = q @ k.transpose(-1, -2)                           # (P, H, T, T)
                S0 = s * dots[..., 1:, 0].mean(-1)
                S1 = s * (dots * pair).sum((-2, -1)) / npair
                n0 = kn[..., 0]
                N1 = (kn[..., None, :] * pair).sum((-2, -1)) / npair
                C0, C1 = S0 / n0, S1 / N1
                nt, at = (n0 - N1) * C0, N1 * (C0 - C1)
                out["norm_share"].append(nt.abs() / (nt.abs() + at.abs()))
                out["gap"].append(S0 - S1)
                out["k0_norm"].append(n0)
                del qn
    finally:
        for h in hs:
            h.remove()
    res = {k: torch.stack(v, 1).numpy() for k, v in out.items()}               # (P, L, H)
    res["a0"] = torch.stack(a0, 1).numpy()
    return res


# ---------------------------------------------------------------------------------- sinklab side
def hf_bare(torch, hf, ids):
    """transformers' base model on the batch, no hooks, no outputs kept (the forward alone)."""
    with torch.inference_mode():
        return hf.model(input_ids=torch.from_numpy(ids), use_cache=False).last_hidden_state


def sl_massive(sl, model, passages, T, bos):
    return sl.massive_activations(model, passages, T=T, bos=bos, skip_short=True, progress=False)


def sl_keygeom(sl, model, passages, T, bos):
    return sl.key_geometry(model, passages, T=T, bos=bos, skip_short=True, progress=False)


def agree_massive(r, h):
    rel = np.abs(r.top_ratio - h["top_ratio"]) / np.abs(h["top_ratio"])
    return {"top_ratio_max_rel": float(rel.max()),
            "bos_norm_max_rel": float((np.abs(r.bos_norm - h["bos_norm"]) / h["bos_norm"]).max()),
            "top1_pos_equal": float((r.top_pos[..., 0] == h["top_pos"][..., 0]).mean()),
            "top_pos_equal": float((r.top_pos == h["top_pos"]).mean()),
            "top_dim_equal": float((r.top_dim == h["top_dim"]).mean()),
            "jump_layer": [r.jump_layer, h["jump_layer"]], "writer": [r.writer, h["writer"]],
            "neurons_equal": bool(r.neurons is not None and np.array_equal(r.neurons, h["neurons"])),
            "neuron_share_max_abs": float(np.abs(r.neuron_share - h["neuron_share"]).max())
            if r.neurons is not None and np.array_equal(r.neurons, h["neurons"]) else float("nan"),
            "neuron_check": [r.neuron_check, h["neuron_check"]]}


def agree_keygeom(r, h):
    ns = np.abs(r.norm_share - h["norm_share"])
    return {"norm_share_max_abs": float(np.nanmax(ns)), "gap_max_abs": float(np.abs(r.gap - h["gap"]).max()),
            "gap_max_ref": float(np.abs(h["gap"]).max()),
            "k0_norm_max_rel": float((np.abs(r.k0_norm - h["k0_norm"]) / h["k0_norm"]).max()),
            "a0_max_abs": float(np.abs(r.a0 - h["a0"]).max())}


def profile(f, n=14):
    pr = cProfile.Profile()
    pr.enable()
    f()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(n)
    return "\n".join(ln for ln in s.getvalue().splitlines() if ln.strip())


def bench_model(sl, torch, name, threads, repeats, do_profile, bare):
    from sinklab.analysis.massive import sequences
    from sinklab.io import registry
    from sinklab.prompts import load_passages
    from sinklab.report import beyond_key_geometry, beyond_massive
    from tests.support.reference_models import hf_gguf_model

    s1, s2 = beyond_massive.settings(True), beyond_key_geometry.settings(True)
    assert s1 == s2, (s1, s2)
    path = str(registry.fetch(name, quiet=True))
    model = sl.load(path, quiet=True)
    hf = hf_gguf_model(path)
    hf.config._attn_implementation = "eager"
    bos = bool(getattr(model.tokenizer, "add_bos_default", True))
    passages = load_passages("sinks")[: s1["n_prompts"]]
    T = s1["T"]
    ids, keep, _ = sequences(model, passages, T, bos, skip_short=True)
    print(f"\n== {model.name}: {len(ids)} of {len(passages)} passages x T = {T}, bos={bos}, "
          f"L = {model.config.n_layers}, H = {model.config.n_heads}, d = {model.config.d_model}")
    fs = {"sl_massive": lambda: sl_massive(sl, model, passages, T, bos),
          "hf_massive": lambda: hf_massive(torch, hf, ids),
          "sl_keygeom": lambda: sl_keygeom(sl, model, passages, T, bos),
          "hf_keygeom": lambda: hf_keygeom(torch, hf, ids)}
    if bare:                                                            # where the time goes: the forwards alone
        fs["sl_forward"] = lambda: model.run(ids, capture=("q", "k", "stats"), progress=False)
        fs["hf_forward"] = lambda: hf_bare(torch, hf, ids)
    rows = []
    for n in threads:
        sl.set_num_threads(n)
        torch.set_num_threads(n)
        with blas_limit(n):
            outs = {k: f() for k, f in fs.items()}                    # warm-up and agreement
            am, ak = agree_massive(outs["sl_massive"], outs["hf_massive"]), \
                agree_keygeom(outs["sl_keygeom"], outs["hf_keygeom"])
            print(f"  {n} thread(s) agreement, massive: {json.dumps(am)}")
            print(f"  {n} thread(s) agreement, key geometry: {json.dumps(ak)}")
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
            if bare:
                fw = {k: statistics.median(ts[k]) for k in ("sl_forward", "hf_forward")}
                print(f"  {n} thread(s) forward alone: sinklab model.run(q, k, stats) {fw['sl_forward']:.2f} s, "
                      f"transformers base model {fw['hf_forward']:.2f} s: hf/sinklab "
                      f"{fw['hf_forward'] / fw['sl_forward']:.2f}x")
                rows.append({"model": model.name, "analysis": "forward", "threads": n,
                             "sl_median_s": fw["sl_forward"], "hf_median_s": fw["hf_forward"],
                             "sl_min_s": min(ts["sl_forward"]), "hf_min_s": min(ts["hf_forward"]),
                             "ratio_hf_over_sl": fw["hf_forward"] / fw["sl_forward"]})
            for an in ("massive", "keygeom"):
                ms, mh = statistics.median(ts["sl_" + an]), statistics.median(ts["hf_" + an])
                row = {"model": model.name, "analysis": an, "threads": n, "sl_median_s": ms,
                       "hf_median_s": mh, "sl_min_s": min(ts["sl_" + an]), "hf_min_s": min(ts["hf_" + an]),
                       "ratio_hf_over_sl": mh / ms, "agreement": am if an == "massive" else ak}
                rows.append(row)
                print(f"  {n} thread(s) {an:8s}: sinklab median {ms:6.2f} s (min {row['sl_min_s']:.2f}), "
                      f"transformers median {mh:6.2f} s (min {row['hf_min_s']:.2f}): hf/sinklab {mh / ms:.2f}x")
            if do_profile:
                for k in ("sl_massive", "sl_keygeom"):
                    t0 = time.perf_counter()
                    with model_run_timer(model) as mt:
                        fs[k]()
                    tot = time.perf_counter() - t0
                    print(f"  {n} thread(s) {k}: total {tot:.2f} s, of which model.run (forward + "
                          f"capture copy) {mt['s']:.2f} s ({100 * mt['s'] / tot:.0f} %)")
                    print(profile(fs[k]))
    del hf
    return rows


class model_run_timer:
    """Times every ``model.run`` call made inside the block (wraps the bound method)."""

    def __init__(self, model):
        self.model, self.acc = model, {"s": 0.0}

    def __enter__(self):
        orig = self.model.run
        acc = self.acc

        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                acc["s"] += time.perf_counter() - t0
        self.model.run = run
        return acc

    def __exit__(self, *exc):
        del self.model.run
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2-135m-instruct")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile each sinklab call once per thread count")
    ap.add_argument("--bare", action="store_true", help="also time the two forwards alone (no analysis)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import torch
    import transformers
    import sinklab as sl

    print(f"CPU: {cpu_name()}")
    for ln in lscpu_lines():
        print("  " + ln)
    print(f"numpy {np.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"sinklab simd {sl.simd()}; load average at start {os.getloadavg()}")
    transformers.logging.set_verbosity_error()
    rows = []
    for name in a.models.split(","):
        rows += bench_model(sl, torch, name, [int(x) for x in a.threads.split(",")], a.repeats, a.profile, a.bare)
    print(f"\nload average at end {os.getloadavg()}")
    report(rows, a.json)


def report(rows, json_path=None):
    """The rows as a table (sinklab and transformers medians, their ratio), and as JSON with the
    CPU when ``json_path`` is given."""
    print(f"{'model':28s} {'analysis':8s} {'threads':>7s} {'sinklab s':>10s} {'hf s':>8s} {'hf/sinklab':>10s}")
    for r in rows:
        print(f"{r['model']:28s} {r['analysis']:8s} {r['threads']:>7d} {r['sl_median_s']:>10.2f} "
              f"{r['hf_median_s']:>8.2f} {r['ratio_hf_over_sl']:>9.2f}x")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"cpu": cpu_name(), "lscpu": lscpu_lines(), "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
