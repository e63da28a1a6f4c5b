#!/usr/bin/env python
"""Training throughput of the attention variants (issue 26 item 5): sinklab's C engine against
PyTorch CPU eager (fp32, AdamW) on the same model, in one process.

The model is the miniature search's (d 128, 4 layers, 8 heads, vocabulary 4096, T 256, 32
windows a step = 8,192 tokens), with each ``attention``: ``softmax`` (torch:
F.scaled_dot_product_attention), ``sink_logit`` and ``softmax1`` (torch: the extra logit column
concatenated before torch.softmax and dropped after it, eager: sdpa has no sink), ``gated``
(sdpa, then z * sigmoid(a W_g^T)); torch's model is tests/support/torch_llama.py with the
Trainer's initial weights. Timing as benchmarks/bench_train.py: warm-up, then sinklab and torch
steps alternating (the first of the pair alternating too) on the same batch, median step time;
tokens/s = 8192 / median. The first warm-up step of each pair prints both losses (the same
weights and batch: they agree to ~1e-6 when the two models are the same).

Usage:
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_variants.py \\
      [--threads 1,2] [--steps 5] [--warmup 1] [--variants softmax,sink_logit,softmax1,gated]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import cpu_name, lscpu_lines  # noqa: E402

VARIANTS = ("softmax", "sink_logit", "softmax1", "gated")
V, D, L, H, T, B = 4096, 128, 4, 8, 256, 32


def pair(variant: str, torch):
    from sinklab.train import AdamW, Trainer, llama_config
    from tests.support.torch_llama import TorchLlama, copy_sinklab_weights, make_adamw

    cfg = llama_config(vocab_size=V, d_model=D, n_layers=L, n_heads=H, context_length=T, attn_variant=variant)
    tr = Trainer(cfg, seed=0, optimizer=AdamW(weight_decay=0.1))
    tm = TorchLlama.from_config(cfg)
    copy_sinklab_weights(tm, tr.weights)
    o = tr.optimizer
    return tr, tm, make_adamw(tm, 1e-3, (o.beta1, o.beta2), o.eps, o.weight_decay)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    import torch

    import sinklab as sl
    from tests.support.torch_llama import torch_train_step

    print(f"cpu: {cpu_name()}")
    for line in lscpu_lines():
        print(f"  {line}")
    print(f"sinklab kernels: {sl.build_info().get('simd', '?')}; torch {torch.__version__}")
    x = np.random.default_rng(1).integers(0, V, size=(B, T + 1), dtype=np.int64)
    ids, tg = np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:])
    rows = []
    for variant in a.variants.split(","):
        tr, tm, opt = pair(variant, torch)
        sl_step = lambda: tr.step(ids, tg, 1e-3)  # noqa: E731
        t_step = lambda: torch_train_step(tm, opt, ids, tg, None, tr.optimizer.grad_clip)  # noqa: E731
        for i, n in enumerate(int(t) for t in a.threads.split(",")):
            torch.set_num_threads(n)
            sl.set_num_threads(n)
            for w in range(a.warmup):
                l_sl, _ = sl_step()
                l_t, _ = t_step()
                if i == 0 and w == 0:
                    print(f"\n{variant}: first step's loss sinklab {l_sl:.6f}, torch {l_t:.6f} "
                          f"(rel {abs(l_sl - l_t) / abs(l_t):.1e})")
            ts = {"sinklab": [], "torch": []}
            for r in range(a.steps):
                for k in (("sinklab", "torch") if r % 2 == 0 else ("torch", "sinklab")):
                    time.sleep(0.05)
                    t0 = time.perf_counter()
                    (sl_step if k == "sinklab" else t_step)()
                    ts[k].append(time.perf_counter() - t0)
            tps = {k: B * T / statistics.median(v) for k, v in ts.items()}
            rows.append((variant, n, tps["sinklab"], tps["torch"]))
            print(f"  {n} thread{'s' if n > 1 else ' '}: sinklab {tps['sinklab']:8.0f} tokens/s, torch {tps['torch']:8.0f} "
                  f"tokens/s, sinklab / torch = {tps['sinklab'] / tps['torch']:.2f}x (median of {a.steps})")
    print("\n| attention | threads | sinklab tokens/s | torch tokens/s | sinklab / torch | sinklab vs its softmax |")
    print("|---|---:|---:|---:|---:|---:|")
    base = {n: s for v, n, s, _ in rows if v == "softmax"}
    for v, n, s, t in rows:
        rel = f"{s / base[n]:.2f}" if n in base else "–"
        print(f"| {v} | {n} | {s:.0f} | {t:.0f} | {s / t:.2f}x | {rel} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
