"""What bf16 and int8 cost in fidelity: sinklab's bf16 / int8 forward against its fp32 forward,
per model.

    python benchmarks/fidelity_precision.py                       # SmolLM2-135M and Gemma-3-270M
    python benchmarks/fidelity_precision.py --models smollm2-135m-instruct --T 64 --ppl-tokens 256
    python benchmarks/fidelity_precision.py --precisions int8     # one low precision only

For each model, on the shipped passages (sinklab.load_passages): the "sinks" split (144 passages)
and the "heldout" split (36), each cut to BOS + T-1 tokens (T = 64, as Gu et al.; shorter
passages are skipped and counted), run once at precision="fp32" and once at each of
--precisions (default bf16 and int8; "low" below):

- sink rate at eps 0.3 and 0.8 (percent of (passage, layer, head) entries with a_0 > eps) and
  its change in points;
- flipped: the fraction of (passage, layer, head) entries whose sink indicator differs;
- max and median |delta a_0| over (passage, layer, head) (a_0 from capture="stats");
- on the held-out passages (BOS + up to --ppl-tokens tokens): perplexity of the next tokens and
  its relative change, and the logits' relative error ||L_low - L_fp32||_F / ||L_fp32||_F over
  every position of every passage (the largest per-passage value too).

--torch adds transformers' own bf16 forward against its fp32 forward (eager attention, the same
GGUF weights dequantized by transformers, the same ids) for the same sink metrics: the reference
point of what a bf16 forward usually costs. Prints a table (and --json writes the numbers). Both precisions run in one process on the same
ids; sinklab's results do not depend on the thread count, so neither do these.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sinklab as sl  # noqa: E402
from machine import cpu_name, lscpu_lines  # noqa: E402

EPS = (0.3, 0.8)


def ids_of(model, texts, T):
    """BOS + the first T-1 tokens of each text with at least T-1 tokens; (P, T) int64, skipped."""
    bos = model.config.bos_token_id
    rows, skipped = [], 0
    for t in texts:
        ids = model.tokenize(t, bos=False)
        if bos is not None:
            ids = np.concatenate([[bos], ids])
        if len(ids) < T:
            skipped += 1
            continue
        rows.append(ids[:T])
    return np.asarray(rows, np.int64), skipped


def a0_of(model, ids, precision):
    tr = model.run(ids, capture="stats", precision=precision, progress=False)
    return tr.stats.importance[..., 0].astype(np.float64)  # (P, L, H)


def sink_metrics(a32, a16):
    """a16: a_0 at the low precision (bf16 or int8; the keys say "bf16" for either)."""
    out = {"entries": int(a32.size)}
    for eps in EPS:
        r32, r16 = float(np.mean(a32 > eps)), float(np.mean(a16 > eps))
        out[f"rate_fp32_{eps}"] = 100 * r32
        out[f"rate_bf16_{eps}"] = 100 * r16
        out[f"rate_diff_points_{eps}"] = 100 * (r16 - r32)
        out[f"flipped_{eps}"] = float(np.mean((a32 > eps) != (a16 > eps)))
    d = np.abs(a16 - a32)
    out["max_da0"], out["median_da0"] = float(d.max()), float(np.median(d))
    return out


def nll_and_logits(model, texts, max_tokens, low="bf16"):
    """Per text: next-token NLL sums and counts at fp32 and at ``low``, and the logits' error
    norms (the keys say "bf16" for either low precision)."""
    bos = model.config.bos_token_id
    acc = {"nll_fp32": 0.0, "nll_bf16": 0.0, "n": 0, "err2": 0.0, "ref2": 0.0, "max_rel": 0.0}
    for t in texts:
        ids = model.tokenize(t, bos=False)
        if bos is not None:
            ids = np.concatenate([[bos], ids])
        ids = np.asarray(ids[:max_tokens], np.int64)
        L = {k: model.run(ids, capture="logits", precision=p, progress=False).logits.astype(np.float64)
             for k, p in (("fp32", "fp32"), ("bf16", low))}
        tgt = ids[1:]
        for p, lg in L.items():
            x = lg[:-1]
            m = x.max(axis=1, keepdims=True)
            lse = (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))
            acc[f"nll_{p}"] += float(np.sum(lse - x[np.arange(len(tgt)), tgt]))
        acc["n"] += len(tgt)
        e2, r2 = float(np.sum((L["bf16"] - L["fp32"]) ** 2)), float(np.sum(L["fp32"] ** 2))
        acc["err2"] += e2
        acc["ref2"] += r2
        acc["max_rel"] = max(acc["max_rel"], (e2 / r2) ** 0.5)
    p32, p16 = np.exp(acc["nll_fp32"] / acc["n"]), np.exp(acc["nll_bf16"] / acc["n"])
    return {"ppl_fp32": float(p32), "ppl_bf16": float(p16), "ppl_rel_diff": float(p16 / p32 - 1),
            "tokens": acc["n"], "logits_rel": (acc["err2"] / acc["ref2"]) ** 0.5, "logits_rel_max": acc["max_rel"]}


def torch_a0(model, ids):
    """transformers' a_0 (P, L, H) at float32 and bfloat16 (eager attention) on the same ids."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    path = model.source
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="eager").eval()
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        hf = hf.to(dtype)
        rows = []
        with torch.no_grad():
            for i in range(len(ids)):
                att = hf(torch.from_numpy(ids[i:i + 1]), output_attentions=True, use_cache=False).attentions
                rows.append(np.stack([a[0, :, :, 0].double().numpy().mean(axis=-1) for a in att]))
        out[name] = np.stack(rows)
    return out


def measure(name, T, ppl_tokens, with_torch=False, low="bf16"):
    t0 = time.perf_counter()
    model = sl.load(name, quiet=True)
    res = {"model": name if low == "bf16" else f"{name} {low}", "precision": low}
    for split in ("sinks", "heldout"):
        ids, skipped = ids_of(model, sl.load_passages(split), T)
        res[split] = dict(sink_metrics(a0_of(model, ids, "fp32"), a0_of(model, ids, low)),
                          passages=len(ids), skipped=skipped)
        if with_torch:
            try:
                t = torch_a0(model, ids)
                res[f"torch_{split}"] = dict(sink_metrics(t["fp32"], t["bf16"]), passages=len(ids))
            except Exception as e:  # e.g. a GGUF architecture transformers cannot load
                res[f"torch_{split}"] = {"error": f"{type(e).__name__}: {e}"}
    res["quality"] = nll_and_logits(model, sl.load_passages("heldout"), ppl_tokens, low)
    res["packed_mb"] = model.packed_bytes / 1e6
    res["seconds"] = time.perf_counter() - t0
    return res


def table(results, T, ppl_tokens):
    lines = ["| model (precision: bf16 unless named) | passages | sink rate ε=0.3 fp32 → low (Δ points) | "
             "ε=0.8 fp32 → low (Δ points) | flipped ε=0.3 / 0.8 | max / median abs Δa₀ | perplexity fp32 → low (rel.) | "
             "logits rel. error (max per passage) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        q = r["quality"]
        for split in ("sinks", "heldout"):
            s = r[split]
            ppl = (f"{q['ppl_fp32']:.3f} → {q['ppl_bf16']:.3f} ({100 * q['ppl_rel_diff']:+.3f} %)"
                   if split == "heldout" else "")
            lg = f"{q['logits_rel']:.4f} ({q['logits_rel_max']:.4f})" if split == "heldout" else ""
            lines.append(
                f"| {r['model']} | {split} {s['passages']} × {T} | {s['rate_fp32_0.3']:.2f} → {s['rate_bf16_0.3']:.2f} "
                f"({s['rate_diff_points_0.3']:+.2f}) | {s['rate_fp32_0.8']:.2f} → {s['rate_bf16_0.8']:.2f} "
                f"({s['rate_diff_points_0.8']:+.2f}) | {100 * s['flipped_0.3']:.2f} % / {100 * s['flipped_0.8']:.2f} % | "
                f"{s['max_da0']:.4f} / {s['median_da0']:.5f} | {ppl} | {lg} |")
    counts = ", ".join(f"{r['quality']['tokens']} for {r['model']}" for r in results)
    for r in results:
        for split in ("sinks", "heldout"):
            s = r.get(f"torch_{split}")
            if s is None:
                continue
            if "error" in s:
                lines.append(f"| {r['model']} (transformers bf16) | {split} | not run: {s['error'][:80]} |  |  |  |  |  |")
                continue
            lines.append(
                f"| {r['model']} (transformers bf16 vs its fp32) | {split} {s['passages']} × {T} | "
                f"{s['rate_fp32_0.3']:.2f} → {s['rate_bf16_0.3']:.2f} ({s['rate_diff_points_0.3']:+.2f}) | "
                f"{s['rate_fp32_0.8']:.2f} → {s['rate_bf16_0.8']:.2f} ({s['rate_diff_points_0.8']:+.2f}) | "
                f"{100 * s['flipped_0.3']:.2f} % / {100 * s['flipped_0.8']:.2f} % | "
                f"{s['max_da0']:.4f} / {s['median_da0']:.5f} |  |  |")
    lines.append(f"(perplexity and logits: the 36 held-out passages, BOS + up to {ppl_tokens - 1} tokens; "
                 f"predicted tokens: {counts})")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma-3-270m"])
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--ppl-tokens", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--torch", action="store_true", help="also transformers' bf16 against its fp32 (eager)")
    ap.add_argument("--precisions", nargs="+", default=["bf16", "int8"], choices=["bf16", "int8"])
    a = ap.parse_args(argv)
    print(f"CPU: {cpu_name()}")
    for ln in lscpu_lines():
        print("  " + ln)
    print(f"sinklab simd: {sl.simd()}, threads: {sl.get_num_threads()}, "
          f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = [measure(n, a.T, a.ppl_tokens, a.torch and p == "bf16", p) for n in a.models for p in a.precisions]
    for r in results:
        print(f"{r['model']}: {r['seconds']:.1f} s, {r['precision']} panels {r['packed_mb']:.0f} MB")
    print(table(results, a.T, a.ppl_tokens))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
