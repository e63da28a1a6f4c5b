#!/usr/bin/env python
"""Training throughput: sinklab's C engine vs PyTorch CPU eager (fp32, AdamW), in one process.

Both train the same LLaMA-2-style model (RMSNorm, RoPE, SwiGLU, no biases) from the same initial
weights on the same batches: sinklab.train.Trainer.step against tests/support/torch_llama.py
(forward, mean cross-entropy, backward, clip_grad_norm_ 1.0, torch.optim.AdamW with weight decay
on the 2-D tensors, foreach=False; attention by F.scaled_dot_product_attention, is_causal=True).
Both run with the same thread count: torch.set_num_threads(n) and sinklab.set_num_threads(n).

Configurations (--config):
  a) the 7.4M-parameter model: d 256, 4 layers, 4 heads, vocab 8192, d_ff 704, T 256, batch 8;
  b) the SmolLM2-135M shape: d 576, 30 layers, 9 heads, 3 kv heads, d_ff 1536, vocab 49152,
     tied embeddings, T 256, batch 4.

Timing: --warmup steps of each, then --steps repetitions, sinklab and torch alternating (the
first of the pair alternating too, with a short pause before each timed step so that idle
OpenMP/OpenBLAS workers of the other library stop spinning), so that a busy core slows both
alike; the median step time gives tokens/s = B*T / median. The first warm-up step of each
configuration starts both from the same weights on the same batch: its two losses are printed
(a misconfigured comparison shows here).

FLOPs per token (causal training, forward + backward = 3 x forward):
    6 * N_mm + 6 * L * T * H * hd
N_mm = matmul weights, the LM head's included (q, k, v, o, gate, up, down of every layer, and
V x d), the embedding lookup not. The attention term: QK^T and PV forwards cost 2 * 2 * hd FLOPs
per (query, key, head) pair on the causal lower triangle, about T/2 keys per query, so 2 T H hd
per token and layer, times 3 for the backward. Norms, RoPE, softmax, SwiGLU, the loss and AdamW
are left out. GFLOP/s = FLOPs per token x tokens/s; "of peak" divides by the best SGEMM rate
measured in this run at the same thread count: a 2048^3 float32 product by NumPy (OpenBLAS,
threads set with threadpoolctl), by sinklab._core.sgemm and by torch.mm (MKL). That peak also
bounds the ratio: no fp32 step beats FLOPs / peak, so sinklab / torch <= peak / torch's GFLOP/s
(printed as "at most").

--check: one config-(a) batch, two optimizer steps of both from the same weights (lr 1e-3):
losses, gradient norms and the weights after the second update must agree (loss to 1e-5
relative); exits 1 otherwise. --phases: where one sinklab step's time goes, from Python
(Trainer.step against the forward alone and the per-window loss gradient).

Usage (unset the variables that pin OpenBLAS's kernel, as for bench_sgemm.py):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_train.py \\
      [--config a|b|all] [--threads 1,2] [--steps 5] [--warmup 1] [--json OUT.json]
  ... bench_train.py --quick          # tiny sizes, 2 steps: a smoke test
  ... bench_train.py --check          # the parity check only
  ... bench_train.py --phases --config a --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import numpy as np

# run from a checkout without installing: the package sits one folder up
_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from machine import cpu_name, lscpu_lines  # noqa: E402

PAUSE_S = 0.2   # before each timed call: lets the other library's idle workers stop spinning
SQUARE = 2048


@dataclass(frozen=True)
class Shape:
    """A model and batch: LLaMA-style, d_ff None = llama_config's default (8/3 d, rounded to 64)."""
    name: str
    vocab: int
    d: int
    layers: int
    heads: int
    kv_heads: int
    d_ff: Optional[int]
    tied: bool
    T: int
    B: int


CONFIGS = {
    "a": Shape("7.4M LLaMA-style", 8192, 256, 4, 4, 4, None, False, 256, 8),
    "b": Shape("SmolLM2-135M shape", 49152, 576, 30, 9, 3, 1536, True, 256, 4),
}
QUICK = {
    "a": Shape("tiny a", 512, 64, 2, 4, 4, None, False, 32, 2),
    "b": Shape("tiny b", 1024, 96, 2, 6, 2, 256, True, 32, 2),
}


# ------------------------------------------------------------------------------------ machine

def blas_info() -> List[Dict[str, Any]]:
    """Every BLAS/OpenMP pool threadpoolctl sees in this process (NumPy's OpenBLAS, the OpenMP runtimes)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"note": "threadpoolctl not installed"}]
    keys = ("user_api", "internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} | {"lib": os.path.basename(i.get("filepath", ""))}
            for i in threadpool_info()]


def machine_info(torch: Any, sl: Any) -> Dict[str, Any]:
    info = {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__, "sinklab_simd": sl.simd(),
            "lscpu": lscpu_lines(), "pools": blas_info(),
            "torch_blas": "MKL" if torch.backends.mkl.is_available() else "not MKL",
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "pinned_env": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}}
    if hasattr(os, "getloadavg"):
        info["loadavg_before"] = os.getloadavg()
    return info


def print_machine(info: Dict[str, Any]) -> None:
    print(f"CPU: {info['cpu']} ({info['logical_cpus']} logical CPUs)   Python {info['python']}   "
          f"NumPy {info['numpy']}   torch {info['torch']} ({info['torch_blas']}, {info['torch_cpu_capability']})   "
          f"sinklab kernels: {info['sinklab_simd']}")
    for line in info["lscpu"]:
        print("  " + line)
    for p in info["pools"]:
        print("  pool: " + ", ".join(f"{k}={v}" for k, v in p.items() if v is not None))
    if "loadavg_before" in info:  # other processes on the machine make 2-thread numbers erratic
        print("load average before: %.2f %.2f %.2f" % tuple(info["loadavg_before"]))
    if info["pinned_env"]:
        print(f"note: {info['pinned_env']} is set and pins OpenBLAS's kernel: run under "
              "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE")


def set_threads(n: int, torch: Any, sl: Any) -> None:
    torch.set_num_threads(n)
    sl.set_num_threads(n)


def sgemm_peak(threads: List[int], size: int, reps: int, torch: Any, sl: Any) -> Dict[int, Dict[str, float]]:
    """GFLOP/s (median of reps calls) of a size^3 float32 product C = A B^T per library and thread
    count; the libraries alternate in blocks, each after a pause."""
    from threadpoolctl import threadpool_limits
    from sinklab import _core

    rng = np.random.default_rng(0)
    A = rng.standard_normal((size, size), dtype=np.float32)
    B = rng.standard_normal((size, size), dtype=np.float32)
    C = np.empty((size, size), np.float32)
    At, Bt, Ct = torch.from_numpy(A), torch.from_numpy(B), torch.empty(size, size)
    calls = {"numpy": lambda: np.matmul(A, B.T, out=C),
             "sinklab": lambda: _core.sgemm(A, B, C),
             "torch": lambda: torch.mm(At, Bt.T, out=Ct)}
    out: Dict[int, Dict[str, float]] = {}
    for n in threads:
        set_threads(n, torch, sl)
        times: Dict[str, List[float]] = {k: [] for k in calls}
        with threadpool_limits(limits=n, user_api="blas"):
            for f in calls.values():  # warm-up: page faults, thread start
                f()
            for _ in range(2):
                for k, f in calls.items():
                    time.sleep(PAUSE_S)
                    for _ in range(-(-reps // 2)):
                        t0 = time.perf_counter()
                        f()
                        times[k].append(time.perf_counter() - t0)
        out[n] = {k: 2.0 * size ** 3 / statistics.median(t) / 1e9 for k, t in times.items()}
        out[n]["best"] = max(out[n].values())
    return out


# ------------------------------------------------------------------------------------ models

def llama_cfg(s: Shape):
    from sinklab.train import llama_config

    return llama_config(s.vocab, s.d, s.layers, s.heads, s.kv_heads, s.d_ff, context_length=max(s.T, 16),
                        tied_embeddings=s.tied)


def flops_per_token(cfg: Any, T: int) -> Dict[str, float]:
    """6 * N_mm + 6 * L * T * H * hd (see the docstring)."""
    d, L, hd = cfg.d_model, cfg.n_layers, cfg.head_dim
    per_layer = d * hd * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) + 3 * d * cfg.d_ff
    n_mm = L * per_layer + cfg.vocab_size * d
    attn = 6.0 * L * T * cfg.n_heads * hd
    return {"n_mm": float(n_mm), "matmul": 6.0 * n_mm, "attention": attn, "total": 6.0 * n_mm + attn}


def make_batch(s: Shape, seed: int) -> tuple:
    """(ids, targets), each (B, T) int64: random tokens and their next tokens."""
    x = np.random.default_rng(seed).integers(0, s.vocab, size=(s.B, s.T + 1), dtype=np.int64)
    return np.ascontiguousarray(x[:, :-1]), np.ascontiguousarray(x[:, 1:])


def make_pair(cfg: Any, lr: float, torch: Any):
    """A sinklab Trainer and the torch model + AdamW with the same initial weights."""
    from sinklab.train import Trainer
    from tests.support.torch_llama import TorchLlama, copy_sinklab_weights, make_adamw

    tr = Trainer(cfg, seed=0)
    tm = TorchLlama.from_config(cfg)
    copy_sinklab_weights(tm, tr.weights)
    o = tr.optimizer
    opt = make_adamw(tm, lr, (o.beta1, o.beta2), o.eps, o.weight_decay)
    return tr, tm, opt


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


# ------------------------------------------------------------------------------------ parity

def check(s: Shape, torch: Any, lr: float = 1e-3, tol: float = 1e-5) -> bool:
    """Two steps of both from the same weights on the same batch: losses, norms, final weights."""
    from tests.support.torch_llama import torch_train_step

    cfg = llama_cfg(s)
    tr, tm, opt = make_pair(cfg, lr, torch)
    ids, tg = make_batch(s, 1)
    ok = True
    print(f"check on {s.name} (B {s.B}, T {s.T}), lr {lr}: loss tolerance {tol:g} relative")
    for k in (1, 2):
        l_sl, n_sl = tr.step(ids, tg, lr)
        l_t, n_t = torch_train_step(tm, opt, ids, tg, None, tr.optimizer.grad_clip)
        good = rel(l_sl, l_t) <= tol and rel(n_sl, n_t) <= 1e-3
        ok &= good
        print(f"  step {k}: loss sinklab {l_sl:.7f} torch {l_t:.7f} (rel {rel(l_sl, l_t):.1e}); grad norm "
              f"sinklab {n_sl:.6f} torch {n_t:.6f} (rel {rel(n_sl, n_t):.1e}) {'ok' if good else 'MISMATCH'}")
    # The weights after two updates, per tensor, in units of lr (what one Adam step moves an
    # element at most): the mean catches a misconfigured weight decay (0.1 lr |w| per step), the
    # max a wrong update; single elements whose gradient is near eps move by a few % of lr apart.
    from tests.support.torch_llama import TorchLlama, copy_sinklab_weights
    after = TorchLlama.from_config(cfg)
    copy_sinklab_weights(after, tr.weights)
    worst_max, worst_mean = (0.0, ""), (0.0, "")
    for (name, p), q in zip(tm.named_parameters(), after.parameters()):
        diff = (p.detach() - q.detach()).abs() / lr
        worst_max = max(worst_max, (float(diff.max()), name))
        worst_mean = max(worst_mean, (float(diff.mean()), name))
    good = worst_max[0] <= 0.25 and worst_mean[0] <= 2e-4
    ok &= good
    print(f"  weights after 2 updates, |sinklab - torch| / lr: largest {worst_max[0]:.1e} ({worst_max[1]}), "
          f"largest tensor mean {worst_mean[0]:.1e} ({worst_mean[1]}) {'ok' if good else 'MISMATCH'} "
          "(tolerances 0.25 and 2e-4)")
    print("check: " + ("PASS" if ok else "FAIL"))
    return ok


# ------------------------------------------------------------------------------------ timing

def timed(f: Callable[[], Any]) -> float:
    time.sleep(PAUSE_S)
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def bench_config(key: str, s: Shape, threads: List[int], steps: int, warmup: int, peak: Dict[int, Dict[str, float]],
                 torch: Any, sl: Any, lr: float = 3e-4) -> List[Dict[str, Any]]:
    from tests.support.torch_llama import torch_train_step

    cfg = llama_cfg(s)
    fl = flops_per_token(cfg, s.T)
    tr, tm, opt = make_pair(cfg, lr, torch)
    n_params = sum(p.numel() for p in tm.parameters())
    print(f"\n({key}) {s.name}: d {s.d}, {s.layers} layers, {s.heads} heads ({s.kv_heads} kv), d_ff {cfg.d_ff}, "
          f"vocab {s.vocab}{', tied' if s.tied else ''}; {n_params / 1e6:.2f}M parameters; T {s.T}, batch {s.B}")
    print(f"    FLOPs/token = 6*N_mm + 6*L*T*H*hd = 6*{fl['n_mm'] / 1e6:.3f}M + 6*{s.layers}*{s.T}*{cfg.n_heads}*"
          f"{cfg.head_dim} = {fl['matmul'] / 1e6:.1f}M + {fl['attention'] / 1e6:.2f}M = {fl['total'] / 1e6:.1f} MFLOP")
    ids, tg = make_batch(s, 1)
    clip = tr.optimizer.grad_clip
    sl_step = lambda: tr.step(ids, tg, lr)  # noqa: E731
    t_step = lambda: torch_train_step(tm, opt, ids, tg, None, clip)  # noqa: E731
    tokens = s.B * s.T
    rows = []
    first = True
    for n in threads:
        set_threads(n, torch, sl)
        for w in range(warmup):
            l_sl, _ = sl_step()
            l_t, _ = t_step()
            if first:  # both from the same weights on the same batch
                print(f"    first step's loss: sinklab {l_sl:.6f}, torch {l_t:.6f} (rel {rel(l_sl, l_t):.1e})")
                first = False
        ts: Dict[str, List[float]] = {"sinklab": [], "torch": []}
        for r in range(steps):
            order = ("sinklab", "torch") if r % 2 == 0 else ("torch", "sinklab")
            for k in order:
                ts[k].append(timed(sl_step if k == "sinklab" else t_step))
        med = {k: statistics.median(v) for k, v in ts.items()}
        row = {"config": key, "threads": n, "B": s.B, "T": s.T, "params": n_params, "flops_per_token": fl["total"],
               "steps": steps, "sgemm_peak_gflops": peak.get(n, {}).get("best")}
        for k in ("sinklab", "torch"):
            tps = tokens / med[k]
            row[k] = {"step_s": med[k], "step_s_all": ts[k], "tokens_per_s": tps, "gflops": fl["total"] * tps / 1e9}
            if row["sgemm_peak_gflops"]:
                row[k]["of_peak"] = row[k]["gflops"] / row["sgemm_peak_gflops"]
        row["ratio"] = row["sinklab"]["tokens_per_s"] / row["torch"]["tokens_per_s"]
        rows.append(row)
        pk = row["sgemm_peak_gflops"]
        for k in ("sinklab", "torch"):
            x = row[k]
            share = f" = {x['of_peak']:5.1%} of {pk:.0f}" if pk else ""
            print(f"    {n} thread{'s' if n > 1 else ' '}  {k:8s} {x['tokens_per_s']:9.0f} tokens/s  "
                  f"step {x['step_s'] * 1e3:8.1f} ms (median of {steps})  {x['gflops']:6.1f} GFLOP/s{share}")
        print(f"    {n} thread{'s' if n > 1 else ' '}  sinklab / torch = {row['ratio']:.2f}x")
        if pk:  # no fp32 code beats the step's FLOPs at the SGEMM peak
            row["bound_ratio"] = pk / row["torch"]["gflops"]
            print(f"    {n} thread{'s' if n > 1 else ' '}  at the SGEMM peak a step takes >= "
                  f"{fl['total'] * tokens / pk / 1e9 * 1e3:.1f} ms: at most {row['bound_ratio']:.2f}x torch")
    return rows


def phases(key: str, s: Shape, threads: List[int], reps: int, torch: Any, sl: Any) -> None:
    """Where a sinklab step goes: Trainer.step vs the forward of the B windows (Model.run with the
    logits) vs the loss gradient of each window alone (Model.loss_and_grad, B calls)."""
    cfg = llama_cfg(s)
    from sinklab.train import Trainer

    tr = Trainer(cfg, seed=0)
    ids, tg = make_batch(s, 1)
    print(f"\nphases of one sinklab step, ({key}) {s.name}, B {s.B}, T {s.T} (median of {reps})")
    for n in threads:
        set_threads(n, torch, sl)
        calls = {"Trainer.step": lambda: tr.step(ids, tg, 1e-4),
                 "forward, B windows (run, logits)": lambda: [tr.model.run(ids[b], capture=("logits",),
                                                                           progress=False) for b in range(s.B)],
                 "loss_and_grad, B windows": lambda: [tr.model.loss_and_grad(ids[b], tg[b]) for b in range(s.B)]}
        for f in calls.values():
            f()
        med = {k: statistics.median(timed(f) for _ in range(reps)) for k, f in calls.items()}
        step = med["Trainer.step"]
        for k, t in med.items():
            print(f"    {n} thread{'s' if n > 1 else ' '}  {k:34s} {t * 1e3:9.1f} ms  ({t / step:5.1%} of the step)")
        print(f"    {n} thread{'s' if n > 1 else ' '}  {'rest (clip, AdamW, zeroing)':34s} "
              f"{(step - med['loss_and_grad, B windows']) * 1e3:9.1f} ms")


# ------------------------------------------------------------------------------------ main

def write_json(path: str, obj: Any) -> None:
    """Atomically: a temp file in the same folder, fsync, os.replace."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".bench_train.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="all", choices=["a", "b", "all"])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--steps", type=int, default=None, help="timed steps of each (default 5; 2 with --quick)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="tiny models, 2 steps: a smoke test")
    ap.add_argument("--check", action="store_true", help="the parity check on config (a) only")
    ap.add_argument("--phases", action="store_true", help="time the phases of a sinklab step only")
    ap.add_argument("--no-peak", action="store_true", help="skip the SGEMM peak measurement")
    ap.add_argument("--json", default=None, help="write all measurements here")
    args = ap.parse_args()
    try:
        threads = [int(x) for x in args.threads.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, got {args.threads!r}")
    if not threads or min(threads) < 1:
        ap.error("--threads needs counts >= 1")
    steps = args.steps or (2 if args.quick else 5)
    if steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be >= 1")

    import torch
    import sinklab as sl

    shapes = QUICK if args.quick else CONFIGS
    keys = ["a", "b"] if args.config == "all" else [args.config]
    info = machine_info(torch, sl)
    print_machine(info)
    if args.check:
        set_threads(threads[0], torch, sl)
        return 0 if check(shapes["a"], torch) else 1
    if args.phases:
        for k in keys:
            phases(k, shapes[k], threads, steps, torch, sl)
        return 0

    peak: Dict[int, Dict[str, float]] = {}
    if not args.no_peak:
        size = 512 if args.quick else SQUARE
        peak = sgemm_peak(threads, size, 4 if args.quick else 6, torch, sl)
        print(f"\nSGEMM peak, {size}^3 float32 (C = A B^T), GFLOP/s, median:")
        for n, p in peak.items():
            print(f"    {n} thread{'s' if n > 1 else ' '}  numpy {p['numpy']:6.1f}   sinklab {p['sinklab']:6.1f}   "
                  f"torch.mm {p['torch']:6.1f}   best {p['best']:6.1f}")
    rows = []
    for k in keys:
        rows += bench_config(k, shapes[k], threads, steps, args.warmup, peak, torch, sl)
    if hasattr(os, "getloadavg"):
        print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    if args.json:
        write_json(args.json, {"info": info, "quick": args.quick, "sgemm_peak": peak, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
