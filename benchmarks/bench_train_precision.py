#!/usr/bin/env python
"""Training in bf16 against the fp32 engine (issue 24 item 4), in one process.

Step time: Trainer(precision="fp32") and Trainer(precision="bf16") from the same weights on the
same batch, their steps alternating (the first of each pair alternating too, with a short pause
before each), the median of --steps; ratio = fp32 median / bf16 median, in wall time and in the
process's CPU time (time.process_time: on a machine shared with other jobs it leaves out the time
the process waited for a core; with 2 threads it sums both, idle spinning included). Configurations as in
bench_train.py: (a) the 7.4M model (d 256, 4 layers, vocab 8192, T 256, batch 8) and (b) the
SmolLM2-135M shape (d 576, 30 layers, 9 heads / 3 kv, d_ff 1536, vocab 49152, tied, T 256,
batch 4). GFLOP/s counts 6 N_mm + 6 L T H hd per token (bench_train.py's docstring); "of the bf16
peak" divides the weight products' share (6 N_mm per token) by the register-only vdpbf16ps rate
(sinklab._core._bf16_peak, one thread) times the thread count: an upper bound on what the bf16
products could reach, the rest of the step (attention, norms, loss, AdamW) left out.

Loss (--loss): --loss-steps optimizer steps (default 300) on the real training corpus
(sinklab.train.corpus, packed intra-document with a fixed <bos>, the 7.4M shape with the
corpus's vocabulary, T 256, batch 8, lr 3e-3 warmup 30 then cosine to 3e-4), fp32 and bf16 from
the same seed on the same batches: the final losses (the last step's, and the mean of the last
20) and the largest gap over the curve; --seed-control adds an fp32 run from another seed on the
same batches, for scale.

Usage:
  python benchmarks/bench_train_precision.py [--config a|b|all] [--threads 1,2] [--steps 5]
  python benchmarks/bench_train_precision.py --loss [--loss-steps 300] [--threads 2] [--seed-control]
  python benchmarks/bench_train_precision.py --quick    # tiny shapes: a smoke test
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench_train import CONFIGS, QUICK, flops_per_token, llama_cfg, make_batch  # noqa: E402
from machine import cpu_name, lscpu_lines  # noqa: E402

PAUSE_S = 0.1
PRECISIONS = ("fp32", "bf16")


def machine(sl: Any) -> Dict[str, Any]:
    from sinklab import _core

    peak = max(_core._bf16_peak(20_000_000) for _ in range(3))
    info = {"cpu": cpu_name(), "lscpu": lscpu_lines(), "simd": sl.simd(),
            "bf16_path": _core._bf16_path(0), "bf16_peak_gflops_1thread": peak,
            "loadavg_before": os.getloadavg() if hasattr(os, "getloadavg") else None}
    print(f"CPU: {info['cpu']}   sinklab kernels: {info['simd']}, bf16 path: {info['bf16_path']}")
    for line in info["lscpu"]:
        print("  " + line)
    print(f"vdpbf16ps register-only peak, 1 thread: {peak:.1f} GFLOP/s")
    if info["loadavg_before"]:
        print("load average before: %.2f %.2f %.2f" % tuple(info["loadavg_before"]))
    return info


def bench_config(key: str, s: Any, threads: List[int], steps: int, warmup: int, peak1: float, sl: Any) -> List[Dict]:
    from sinklab.train import Trainer

    cfg = llama_cfg(s)
    fl = flops_per_token(cfg, s.T)
    ids, targets = make_batch(s, seed=1)
    print(f"\n({key}) {s.name}: d {s.d}, {s.layers} layers, {s.heads} heads ({s.kv_heads} kv), d_ff {cfg.d_ff}, "
          f"vocab {s.vocab}{', tied' if s.tied else ''}; T {s.T}, batch {s.B}")
    out = []
    for n in threads:
        sl.set_num_threads(n)
        trs = {p: Trainer(cfg, seed=0, precision=p) for p in PRECISIONS}
        first = {p: trs[p].step(ids, targets, 1e-4)[0] for p in PRECISIONS}
        for _ in range(max(0, warmup - 1)):
            for p in PRECISIONS:
                trs[p].step(ids, targets, 1e-4)
        times: Dict[str, List[float]] = {p: [] for p in PRECISIONS}
        cpu: Dict[str, List[float]] = {p: [] for p in PRECISIONS}
        for r in range(steps):
            order = PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]
            for p in order:
                time.sleep(PAUSE_S)
                t0, c0 = time.perf_counter(), time.process_time()
                trs[p].step(ids, targets, 1e-4)
                times[p].append(time.perf_counter() - t0)
                cpu[p].append(time.process_time() - c0)
        med = {p: statistics.median(times[p]) for p in PRECISIONS}
        cmed = {p: statistics.median(cpu[p]) for p in PRECISIONS}
        tok = s.B * s.T
        row = {"config": key, "threads": n, "steps": steps, "first_loss": first,
               "step_s": med, "all_s": times, "ratio": med["fp32"] / med["bf16"],
               "cpu_s": cmed, "all_cpu_s": cpu, "cpu_ratio": cmed["fp32"] / cmed["bf16"]}
        print(f"    first step's loss: fp32 {first['fp32']:.6f}, bf16 {first['bf16']:.6f} "
              f"(diff {first['bf16'] - first['fp32']:+.2e})")
        for p in PRECISIONS:
            gf = fl["total"] * tok / med[p] / 1e9
            line = (f"    {n} thread{'s' if n > 1 else ' '} {p}  step {med[p] * 1e3:9.1f} ms (median of {steps})  "
                    f"{tok / med[p]:8.0f} tokens/s  {gf:6.1f} GFLOP/s")
            if p == "bf16" and peak1 > 0:
                frac = fl["matmul"] * tok / med[p] / 1e9 / (peak1 * n)
                row["bf16_matmul_fraction_of_peak"] = frac
                line += f"  (weight products at {100 * frac:.1f}% of the bf16 peak x {n})"
            print(line)
        print(f"    {n} thread{'s' if n > 1 else ' '} bf16 / fp32 speed-up = {row['ratio']:.2f}x   (process CPU time: "
              f"fp32 {cmed['fp32'] * 1e3:.1f} ms, bf16 {cmed['bf16'] * 1e3:.1f} ms, {row['cpu_ratio']:.2f}x)")
        out.append(row)
        del trs
    return out


def loss_curves(steps: int, threads: int, sl: Any, T: int = 256, B: int = 8, control: bool = False) -> Dict[str, Any]:
    from sinklab.train import Packer, Trainer, llama_config, lr_schedule
    from sinklab.train import corpus as C

    corpus = C.prepare_corpus(quiet=True)
    sl.set_num_threads(threads)
    cfg = llama_config(corpus.vocab_size, d_model=256, n_layers=4, n_heads=4, context_length=T)
    packer = Packer(corpus.train_tokens, corpus.train_doc_offsets, T, True, corpus.bos_id, True)
    curves, secs = {}, {}
    runs = [(p, p, 0) for p in PRECISIONS] + ([("fp32_seed1", "fp32", 1)] if control else [])
    for p, prec, seed in runs:
        tr = Trainer(cfg, seed=seed, precision=prec)
        losses = []
        t0 = time.perf_counter()
        for s in range(steps):
            ids, targets, ks = packer.batch(s, B, 0)
            lr = lr_schedule(s + 1, 3e-3, 3e-4, 30, steps)
            losses.append(tr.step(ids, targets, lr, key_start=ks, keep_first=True)[0])
        secs[p] = time.perf_counter() - t0
        curves[p] = np.array(losses)
        print(f"  {p}: {steps} steps in {secs[p]:.1f} s; loss step 1 {losses[0]:.4f}, step {steps} {losses[-1]:.4f}, "
              f"mean of the last 20 {curves[p][-20:].mean():.4f}")
    d = curves["bf16"] - curves["fp32"]
    res = {"steps": steps, "threads": threads, "T": T, "B": B, "vocab": corpus.vocab_size,
           "n_params": sum(int(np.prod(v.shape)) for v in Trainer(cfg, init=False).weights.values()),
           "unigram_entropy": float(corpus.unigram_entropy), "seconds": secs,
           "final_fp32": float(curves["fp32"][-1]), "final_bf16": float(curves["bf16"][-1]),
           "final_diff": float(d[-1]), "last20_diff": float(d[-20:].mean()),
           "max_abs_gap": float(np.abs(d).max()), "max_abs_gap_step": int(np.abs(d).argmax()) + 1,
           "curves": {p: c.tolist() for p, c in curves.items()}}
    if control:  # what another initial seed alone moves the loss by, same batches
        c = curves["fp32_seed1"] - curves["fp32"]
        res["seed_control"] = {"final_diff": float(c[-1]), "last20_diff": float(c[-20:].mean()),
                               "max_abs_gap": float(np.abs(c).max())}
        print(f"  fp32 seed 1 - fp32 seed 0: last step {c[-1]:+.4f} nats, mean of the last 20 {c[-20:].mean():+.4f}, "
              f"largest gap {np.abs(c).max():.4f}")
    print(f"  bf16 - fp32: last step {res['final_diff']:+.4f} nats, mean of the last 20 {res['last20_diff']:+.4f}, "
          f"largest gap {res['max_abs_gap']:.4f} (step {res['max_abs_gap_step']}); unigram entropy "
          f"{res['unigram_entropy']:.3f}")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="all", choices=["a", "b", "all"])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--loss", action="store_true", help="the loss-curve comparison on the real corpus only")
    ap.add_argument("--loss-steps", type=int, default=300)
    ap.add_argument("--seed-control", action="store_true",
                    help="with --loss: also fp32 from seed 1, to show what the initial seed alone moves the loss by")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import sinklab as sl

    threads = [int(x) for x in a.threads.split(",")]
    result: Dict[str, Any] = {"machine": machine(sl), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if a.loss:
        print(f"\nloss curves on the real corpus, {a.loss_steps} steps, {threads[-1]} threads:")
        result["loss"] = loss_curves(a.loss_steps, threads[-1], sl, control=a.seed_control)
    else:
        shapes = QUICK if a.quick else CONFIGS
        keys = ["a", "b"] if a.config == "all" else [a.config]
        result["steps"] = []
        for k in keys:
            result["steps"] += bench_config(k, shapes[k], threads, 2 if a.quick else a.steps, a.warmup,
                                            result["machine"]["bf16_peak_gflops_1thread"], sl)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
