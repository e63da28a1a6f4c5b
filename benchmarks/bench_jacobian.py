#!/usr/bin/env python
"""Jacobians, sensitivity maps and VJPs: sinklab vs PyTorch (HF transformers, eager, fp32, CPU).

Everything is about SmolLM2-135M-Instruct, loaded twice from the same GGUF file: by sinklab
(``sl.load``) and by transformers' own GGUF loader (dequantized to fp32, as in
tests/support/reference_models.hf_gguf_reference). resid[l] is the residual stream entering layer l
(resid[0] = the input token embeddings), resid[L] the last layer's output with the final norm
removed; the target is resid[L] at the last position. Both libraries run in this one process with
the same thread count (``torch.set_num_threads(n)``, ``sinklab.set_num_threads(n)``).

  a) full Jacobian d resid[L][-1] / d resid[0], shape (d, T, d), T = 64 (and 256 with --long):
     torch.func.jacrev; a loop of d torch.autograd.grad calls; one autograd.grad with the d
     unit cotangents batched (is_grads_batched=True, in chunks); sinklab Model.jacobian.
  b) exact sensitivity map ||d resid[L][-1] / d resid[l][j]||_F for every l in 0..L, j < T:
     torch captures the gradient at every layer's input through an additive zero probe (a
     forward pre-hook on each decoder layer; the final norm is replaced by an identity that
     adds the probe for resid[L]) and pushes the d unit cotangents through one backward graph,
     batched: (i) autograd.grad(is_grads_batched=True), (ii) torch.func.vmap over
     torch.func.vjp, both in chunks of cotangents; vs sinklab.sensitivity(method="exact") with
     spectral=False and spectral=True (the spectral norms' extra cost).
  c) 32-probe random-projection estimate: torch pushes 32 cotangents u (Gaussian, and random
     signs as sinklab uses; one batched backward each) and estimates ||J||_F^2 = E ||u^T J||^2
     by the mean over probes; vs
     sinklab.sensitivity(method="estimate", n_probes=32). Error = |est - exact| / exact of the
     Frobenius norm, median and worst over (l, j) with exact > 0 (resid[L][j] for j != target
     has an exactly zero Jacobian and is left out). T = 64 and 256; sinklab alone at 2048
     (time, and its own standard error relative to its estimate).
  d) one VJP (single cotangent at resid[L][-1], gradients at every resid[l]) vs one forward at
     T = 512: sinklab Model.vjp vs Model.run(capture=()); torch: forward + backward of the
     probed stream vs a forward under inference_mode. Reported as the ratio vjp / forward.

FLOP count. F(T) = forward FLOPs of the layers (no embedding, no LM head):
    F(T) = 2 T L P + 4 L H hd T(T+1)/2
P = matmul weights per layer (q, k, v, o, gate, up, down), H query heads of width hd, the
attention term counting QK^T and PV on the causal lower triangle. A backward that wants input
gradients only (the weights are frozen: requires_grad=False in torch) runs every linear
layer's GEMM once, transposed, so one backward is counted as F(T) too (the attention backward
does 4 T x T products against the forward's 2; left out, as in the issue: 2% of F at T = 64,
4% at 256, 8% at 512). Full Jacobian and exact map: d x F(T) (7.9 TFLOP at T = 64, 32.6 at
256); estimate: n_probes x F(T); VJP: 2 F(T) (its own forward + backward). GFLOP/s is that
count over the measured time, and "of peak" divides by the machine's measured SGEMM peak: the
better of sinklab._core.sgemm_nt and torch.mm on a 512 x 1536 x 576 product (the gate/up shape
at T = 512), timed in the same run.

Time: the best of --repeats calls for rows that take under ~10 s, else one call. Memory: peak
RSS growth during the row, in this process: gc + malloc_trim(0), then the kernel's high-water
mark VmHWM is reset (writing 5 to /proc/self/clear_refs, Linux >= 4.0) and the row reports
VmHWM - RSS before the row (a 2 ms RSS-sampling thread where clear_refs is not available);
this includes outputs the row returns (e.g. the (d, T, d) Jacobian: 85 MB at T = 64).

Usage:
  python benchmarks/bench_jacobian.py [--threads 2] [--quick] [--long] [--json OUT.json]
--quick runs every part at T = 16 (d at 64, the 2048 row at 64) as a smoke test. On machines
where OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE are set, unset them for the command
(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_jacobian.py), as for
bench_sgemm.py.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable, Optional

import numpy as np
from machine import cpu_name

# run from a checkout without installing: the package sits one folder up
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni",
              "avx512_bf16", "amx_tile")
CHEAP_S = 10.0        # rows faster than this are repeated (best of --repeats)


# ------------------------------------------------------------------------------------ machine

def cpu_flags() -> list[str]:
    """The SIMD flags of /proc/cpuinfo that matter for fp32 GEMM (subset of SIMD_FLAGS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [x for x in SIMD_FLAGS if x in have]
    except OSError:
        pass
    return []


def blas_info() -> list[dict]:
    """Every BLAS/OpenMP pool threadpoolctl sees in this process (torch's and NumPy's)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"note": "threadpoolctl not installed"}]
    out = []
    for i in threadpool_info():
        out.append({k: i.get(k) for k in ("user_api", "internal_api", "version", "architecture",
                                          "num_threads")}
                   | {"lib": os.path.basename(i.get("filepath", ""))})
    return out


# ------------------------------------------------------------------------------------ memory

def _status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


class PeakRSS:
    """Peak resident-set growth (MiB) of this process while the block runs (see the docstring)."""

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        if _malloc_trim is not None:
            _malloc_trim(0)  # hand freed heap back, so the baseline is what is really in use
        self.sampler = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            self.sampler = _Sampler()
        self.base_kb = _status_kb("VmRSS") or 0
        if self.sampler is not None:
            self.sampler.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.sampler is not None:
            peak_kb = self.sampler.stop()
        else:
            peak_kb = _status_kb("VmHWM") or 0
        self.peak_mb = peak_kb / 1024
        self.delta_mb = max(0, peak_kb - self.base_kb) / 1024


class _Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, _status_kb("VmRSS") or 0)
            time.sleep(0.002)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, _status_kb("VmRSS") or 0)


# ------------------------------------------------------------------------------------ models

def make_ids(T: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=T, dtype=np.int64)
    ids[0] = 1
    return ids


def load_hf(path: str):
    """HF fp32 eager model from the GGUF file (as tests/support/reference_models.hf_gguf_reference)."""
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="eager")
    m.eval()
    for p in m.parameters():  # input gradients only, like sinklab: no weight-gradient GEMMs
        p.requires_grad_(False)
    return torch, m


class TorchStream:
    """resid[L] (T, d) of the HF model as a function of the input embeddings x (T, d), with
    optional additive probes z[l] (T, d) at every resid[l], l = 0..L: d out / d z[l] is the
    gradient at resid[l]. Layers, mask and RoPE are HF's own (pre-hooks, no re-implementation)."""

    def __init__(self, torch: Any, hf: Any) -> None:
        self.torch = torch
        self.lm = hf.model
        self.L = len(self.lm.layers)
        self.probes: Optional[tuple] = None
        stream = self

        class ProbeOut(torch.nn.Module):  # replaces the final norm: resid[L] (+ its probe)
            def forward(self, h):
                return h if stream.probes is None else h + stream.probes[stream.L]

        self.lm.norm = ProbeOut()
        for l, layer in enumerate(self.lm.layers):
            layer.register_forward_pre_hook(self._pre_hook(l))

    def _pre_hook(self, l: int) -> Callable:
        def hook(module, args):
            if self.probes is None:
                return None
            return (args[0] + self.probes[l],) + tuple(args[1:])
        return hook

    def embed(self, ids: np.ndarray):
        with self.torch.no_grad():
            return self.lm.embed_tokens(self.torch.from_numpy(ids)).detach().clone()

    def __call__(self, x, probes: Optional[tuple] = None):
        self.probes = probes
        try:
            return self.lm(inputs_embeds=x[None], use_cache=False).last_hidden_state[0]
        finally:
            self.probes = None


def forward_flops(cfg: Any, T: int) -> float:
    """F(T) of the docstring, from an HF LlamaConfig."""
    d, L, H = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    hd = getattr(cfg, "head_dim", None) or d // H
    G = cfg.num_key_value_heads
    P = d * H * hd + 2 * d * G * hd + H * hd * d + 3 * d * cfg.intermediate_size
    return 2.0 * T * L * P + 4.0 * L * H * hd * T * (T + 1) / 2


# ------------------------------------------------------------------------------------ torch side

def chunks(n: int, size: int):
    for a in range(0, n, size):
        yield a, min(n, a + size)


def torch_jacrev(torch, stream: TorchStream, x):
    return torch.func.jacrev(lambda e: stream(e)[-1])(x)


def torch_jac_loop(torch, stream: TorchStream, x):
    x = x.detach().requires_grad_(True)
    y = stream(x)[-1]
    d = y.shape[0]
    J = torch.empty((d,) + tuple(x.shape))
    eye = torch.eye(d)
    for a in range(d):
        J[a] = torch.autograd.grad(y, x, grad_outputs=eye[a], retain_graph=True)[0]
    return J


def torch_jac_batched(torch, stream: TorchStream, x, chunk: int):
    x = x.detach().requires_grad_(True)
    y = stream(x)[-1]
    d = y.shape[0]
    J = torch.empty((d,) + tuple(x.shape))
    eye = torch.eye(d)
    for a, b in chunks(d, chunk):
        J[a:b] = torch.autograd.grad(y, x, grad_outputs=eye[a:b], retain_graph=True,
                                     is_grads_batched=True)[0]
    return J


def _probes(torch, stream: TorchStream, x, requires_grad: bool = True) -> tuple:
    return tuple(torch.zeros_like(x).requires_grad_(requires_grad) for _ in range(stream.L + 1))


def torch_map_autograd(torch, stream: TorchStream, x, chunk: int) -> np.ndarray:
    """Exact Frobenius map (L+1, T) float64: d unit cotangents, batched autograd.grad."""
    z = _probes(torch, stream, x)
    y = stream(x, z)[-1]
    d = y.shape[0]
    eye = torch.eye(d)
    fro2 = torch.zeros((stream.L + 1, x.shape[0]), dtype=torch.float64)
    for a, b in chunks(d, chunk):
        gs = torch.autograd.grad(y, z, grad_outputs=eye[a:b], retain_graph=True,
                                 is_grads_batched=True)
        for l, g in enumerate(gs):
            fro2[l] += g.square().sum(dim=(0, 2), dtype=torch.float64)
    return fro2.sqrt().numpy()


def torch_map_func(torch, stream: TorchStream, x, chunk: int) -> np.ndarray:
    """Exact Frobenius map (L+1, T) float64: torch.func.vmap over torch.func.vjp."""
    z = _probes(torch, stream, x, requires_grad=False)
    _, vjp_fn = torch.func.vjp(lambda *zz: stream(x, zz)[-1], *z)
    d = x.shape[1]
    eye = torch.eye(d)
    fro2 = torch.zeros((stream.L + 1, x.shape[0]), dtype=torch.float64)
    batched = torch.func.vmap(vjp_fn)
    for a, b in chunks(d, chunk):
        gs = batched(eye[a:b])
        for l, g in enumerate(gs):
            fro2[l] += g.square().sum(dim=(0, 2), dtype=torch.float64)
    return fro2.sqrt().numpy()


def torch_map_estimate(torch, stream: TorchStream, x, n_probes: int, dist: str = "gaussian",
                       seed: int = 0) -> np.ndarray:
    """Random-projection Frobenius map (L+1, T) float64: n_probes cotangents u with E[u u^T] = I
    (Gaussian, or random signs), one batched backward, ||J||_F^2 ~ mean_k ||u_k^T J||^2."""
    gen = torch.Generator().manual_seed(seed)
    U = torch.randn((n_probes, x.shape[1]), generator=gen)
    if dist == "signs":
        U = U.sign()
    z = _probes(torch, stream, x)
    y = stream(x, z)[-1]
    gs = torch.autograd.grad(y, z, grad_outputs=U, is_grads_batched=True)
    fro2 = torch.stack([g.square().sum(dim=2, dtype=torch.float64).mean(dim=0) for g in gs])
    return fro2.sqrt().numpy()


def torch_vjp(torch, stream: TorchStream, x, cot):
    z = _probes(torch, stream, x)
    y = stream(x, z)[-1]
    return torch.autograd.grad(y, z, grad_outputs=cot)


def torch_forward(torch, stream: TorchStream, x):
    with torch.inference_mode():
        return stream(x)


# ------------------------------------------------------------------------------------ harness

class Bench:
    def __init__(self, args: argparse.Namespace, flops_fn: Callable[[int], float]) -> None:
        self.args = args
        self.rows: list[dict] = []
        self.flops_fn = flops_fn
        self.peak_gflops: Optional[float] = None

    def measure(self, part: str, lib: str, what: str, T: int, fn: Callable[[], Any],
                flop: Optional[float], repeats: Optional[int] = None) -> tuple[Any, dict]:
        """Runs fn (best of `repeats` if the first call is under CHEAP_S seconds), records a row."""
        reps = self.args.repeats if repeats is None else repeats
        time.sleep(0.3)  # idle OpenMP workers of the other library stop spinning
        times = []
        out = None
        try:
            with PeakRSS() as mem:
                for r in range(max(1, reps)):
                    out = None
                    t0 = time.perf_counter()
                    out = fn()
                    times.append(time.perf_counter() - t0)
                    if times[0] >= CHEAP_S:
                        break
        except Exception as e:  # an API not there yet, or a torch transform that fails
            row = {"part": part, "lib": lib, "what": what, "T": T,
                   "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"}
            self.rows.append(row)
            print(f"  [{part}] T={T} {lib:7s} {what}: {row['error']}", flush=True)
            return None, row
        best = min(times)
        row = {"part": part, "lib": lib, "what": what, "T": T, "seconds": best, "times": times,
               "flop": flop, "gflops": (flop / best / 1e9) if flop else None,
               "mem_delta_mb": mem.delta_mb, "peak_rss_mb": mem.peak_mb}
        if row["gflops"] and self.peak_gflops:
            row["of_peak"] = row["gflops"] / self.peak_gflops
        self.rows.append(row)
        print(f"  [{part}] T={T} {lib:7s} {what}: {best:.3f} s (n={len(times)})"
              + (f", {row['gflops']:.1f} GFLOP/s" if row["gflops"] else "")
              + f", +{mem.delta_mb:.0f} MiB", flush=True)
        return out, row

    def note(self, row: dict, **kv: Any) -> None:
        row.update(kv)
        print("        " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                     for k, v in kv.items()), flush=True)


def sgemm_peak(torch: Any, threads: int) -> dict:
    """Best GFLOP/s of sinklab._core.sgemm_nt and torch.mm on C (512, 1536) = A (512, 576) B^T."""
    from sinklab import _core
    M, N, K = 512, 1536, 576
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((N, K), dtype=np.float32)
    C = np.empty((M, N), np.float32)
    flop = 2.0 * M * N * K
    res = {"shape": f"{M}x{N}x{K}"}
    _core.set_num_threads(threads)
    fns = {"sinklab_sgemm_nt": lambda: _core.sgemm_nt(A, B, C)}
    if torch is not None:
        tA, tB, tC = torch.from_numpy(A), torch.from_numpy(B), torch.from_numpy(np.empty_like(C))
        fns["torch_mm"] = lambda: torch.mm(tA, tB.t(), out=tC)
    for name, f in fns.items():
        time.sleep(0.3)
        for _ in range(3):
            f()
        ts = []
        for _ in range(30):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        res[name] = flop / min(ts) / 1e9
    res["peak"] = max(v for k, v in res.items() if k != "shape")
    return res


def rel_err_stats(est: np.ndarray, exact: np.ndarray) -> dict:
    m = exact > 0
    e = np.abs(est[m] - exact[m]) / exact[m]
    return {"median_rel_err": float(np.median(e)), "worst_rel_err": float(e.max())}


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / ||b|| (Frobenius over everything)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ------------------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, choices=[1, 2])
    ap.add_argument("--quick", action="store_true", help="T = 16 everywhere (smoke test)")
    ap.add_argument("--long", action="store_true", help="parts a and b also at T = 256")
    ap.add_argument("--parts", default="abcd", help="which parts to run, in this order (default abcd)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many for cheap rows")
    ap.add_argument("--chunk", type=int, default=0,
                    help="cotangents per batched torch backward (default: as many as fit 512 MB)")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-slow-torch", action="store_true",
                    help="leave out torch.func.jacrev and the autograd loop (the slowest rows)")
    ap.add_argument("--model", default=None, help="GGUF path (default: the registry's SmolLM2)")
    ap.add_argument("--json", default=None, help="write all rows here")
    args = ap.parse_args()

    import sinklab as sl
    sl_model = sl.load(args.model or "smollm2-135m-instruct")
    path = args.model or str(__import__("sinklab.io.registry", fromlist=["fetch"]).fetch(
        "smollm2-135m-instruct", quiet=True))
    torch, hf = (None, None) if args.skip_torch else load_hf(path)
    n = args.threads
    sl.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    cfg = hf.config if hf is not None else None
    L = sl_model.config.n_layers if hasattr(sl_model.config, "n_layers") else cfg.num_hidden_layers
    d = sl_model.config.d_model if hasattr(sl_model.config, "d_model") else cfg.hidden_size
    vocab = sl_model.config.vocab_size
    stream = TorchStream(torch, hf) if hf is not None else None

    if cfg is None:  # FLOPs from sinklab's config when torch is skipped (same formula)
        c = sl_model.config

        class _Cfg:
            hidden_size, num_hidden_layers = d, L
            num_attention_heads, num_key_value_heads = c.n_heads, c.n_kv_heads
            head_dim = getattr(c, "head_dim", d // c.n_heads)
            intermediate_size = c.d_ff
        cfg = _Cfg()
    F = lambda T: forward_flops(cfg, T)  # noqa: E731

    Ts_ab = [16] if args.quick else ([64, 256] if args.long else [64])
    Ts_c = [16] if args.quick else [64, 256]
    T_c_long = 64 if args.quick else 2048
    T_d = 64 if args.quick else 512

    info = {"model": os.path.basename(path), "threads": n, "python": platform.python_version(),
            "cpu": cpu_name(), "cores": os.cpu_count(), "simd_flags": cpu_flags(),
            "sinklab_simd": sl.simd() if hasattr(sl, "simd") else None,
            "torch": getattr(torch, "__version__", None),
            "transformers": None if hf is None else __import__("transformers").__version__,
            "blas": blas_info(),
            "pinned_openblas": {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
                                if k in os.environ}}
    for k, v in info.items():
        print(f"# {k}: {v}")
    if hasattr(os, "getloadavg"):
        print("# load average before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)

    bench = Bench(args, F)
    peak = sgemm_peak(torch, n)
    bench.peak_gflops = peak["peak"]
    print(f"# SGEMM {peak['shape']}: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in peak.items()
                                                  if k not in ("shape",)), flush=True)

    def chunk_for(T: int) -> int:
        if args.chunk:
            return args.chunk
        return int(max(8, min(d, (512 << 20) // ((L + 1) * T * d * 4))))

    exact_maps: dict[int, np.ndarray] = {}
    has = {"jacobian": hasattr(sl_model, "jacobian"), "vjp": hasattr(sl_model, "vjp"),
           "sensitivity": hasattr(sl, "sensitivity")}
    print(f"# sinklab API present: {has}", flush=True)

    # one-time costs (thread pools, first backward: up to ~15 s for torch on a loaded machine)
    # are paid here, not by the first timed row
    ids = make_ids(16, vocab)
    sl_model.vjp(ids, np.ones(d, np.float32), at=(L, -1))
    if stream is not None:
        torch_vjp(torch, stream, stream.embed(ids), torch.ones(d))
        torch_map_estimate(torch, stream, stream.embed(ids), 4)

    # ---------------------------------------------------------------- a) full Jacobian
    def part_a():
        print("\n## a) full Jacobian d resid[L][-1] / d resid[0]", flush=True)
        for T in Ts_ab:
            ids = make_ids(T, vocab)
            flop = d * F(T)
            J_sl = J_t = None
            if has["jacobian"]:
                J_sl, _ = bench.measure("a", "sinklab", "Model.jacobian", T,
                                        lambda: sl_model.jacobian(ids, of=(L, -1), wrt=0, progress=False),
                                        flop)
            if stream is not None:
                x = stream.embed(ids)
                c = chunk_for(T)
                J_t, row = bench.measure("a", "torch", f"autograd.grad batched (chunks of {c})", T,
                                         lambda: torch_jac_batched(torch, stream, x, c), flop)
                if J_t is not None and J_sl is not None:
                    bench.note(row, rel_diff_sinklab_vs_torch=rel_diff(J_sl, J_t.numpy()))
                if not args.skip_slow_torch:
                    Jl, row = bench.measure("a", "torch", "loop of d autograd.grad", T,
                                            lambda: torch_jac_loop(torch, stream, x), flop, repeats=1)
                    if Jl is not None and J_t is not None:
                        bench.note(row, rel_diff_vs_batched=rel_diff(Jl.numpy(), J_t.numpy()))
                    del Jl
                    Jr, row = bench.measure("a", "torch", "torch.func.jacrev", T,
                                            lambda: torch_jacrev(torch, stream, x), flop, repeats=1)
                    if Jr is not None and J_t is not None:
                        bench.note(row, rel_diff_vs_batched=rel_diff(Jr.numpy(), J_t.numpy()))
                    del Jr
            del J_sl, J_t

    # ---------------------------------------------------------------- b) exact sensitivity map
    def sl_exact(T: int, ids: np.ndarray, spectral: bool, what: str):
        return bench.measure("b", "sinklab", what, T,
                             lambda: sl.sensitivity(sl_model, ids, method="exact", spectral=spectral,
                                                    progress=False), d * F(T))

    def part_b():
        print("\n## b) exact sensitivity map, all layers 0..L, all source positions", flush=True)
        for T in Ts_ab:
            ids = make_ids(T, vocab)
            flop = d * F(T)
            ref = None
            if has["sensitivity"]:
                s, _ = sl_exact(T, ids, False, "sensitivity exact, spectral=False")
                if s is not None:
                    exact_maps[T] = ref = np.asarray(s.fro)
                s, row = sl_exact(T, ids, True, "sensitivity exact, spectral=True")
                if s is not None and ref is not None:
                    bench.note(row, fro_rel_diff_vs_spectral_false=rel_diff(np.asarray(s.fro), ref))
            if stream is not None:
                x = stream.embed(ids)
                c = chunk_for(T)
                m1, row = bench.measure("b", "torch", f"autograd.grad is_grads_batched (chunks of {c})",
                                        T, lambda: torch_map_autograd(torch, stream, x, c), flop)
                if m1 is not None:
                    if ref is not None:
                        bench.note(row, rel_diff_sinklab_vs_torch=rel_diff(ref, m1))
                    exact_maps.setdefault(T, m1)
                m2, row = bench.measure("b", "torch", f"torch.func vmap(vjp) (chunks of {c})", T,
                                        lambda: torch_map_func(torch, stream, x, c), flop)
                if m2 is not None and m1 is not None:
                    bench.note(row, rel_diff_vs_autograd=rel_diff(m2, m1))

    # ---------------------------------------------------------------- c) estimate
    def part_c():
        print("\n## c) random-projection estimate, 32 probes", flush=True)
        P = 32
        for T in Ts_c + [T_c_long]:
            ids = make_ids(T, vocab)
            flop = P * F(T)
            long_row = T == T_c_long and T not in Ts_c
            if T not in exact_maps and not long_row:  # the reference: sinklab exact, else torch
                if has["sensitivity"]:
                    s, _ = sl_exact(T, ids, False, "sensitivity exact (reference for c)")
                    if s is not None:
                        exact_maps[T] = np.asarray(s.fro)
                elif stream is not None:
                    x = stream.embed(ids)
                    m, _ = bench.measure("b", "torch", "autograd.grad is_grads_batched (reference for c)",
                                         T, lambda: torch_map_autograd(torch, stream, x, chunk_for(T)),
                                         d * F(T))
                    if m is not None:
                        exact_maps[T] = m
            ref = exact_maps.get(T)
            if has["sensitivity"]:
                s, row = bench.measure("c", "sinklab", f"sensitivity estimate, n_probes={P}", T,
                                       lambda: sl.sensitivity(sl_model, ids, method="estimate",
                                                              n_probes=P, seed=0, progress=False),
                                       flop)
                if s is not None:
                    est = np.asarray(s.fro)
                    if ref is not None:
                        bench.note(row, **rel_err_stats(est, ref))
                    if s.stderr is not None:
                        m = est > 0
                        rse = np.asarray(s.stderr)[m] / est[m]
                        bench.note(row, median_rel_stderr=float(np.median(rse)),
                                   worst_rel_stderr=float(rse.max()))
            if stream is not None and not long_row:
                x = stream.embed(ids)
                for dist in ("gaussian", "signs"):
                    est, row = bench.measure("c", "torch", f"{P} {dist} cotangents, batched autograd.grad",
                                             T, lambda: torch_map_estimate(torch, stream, x, P, dist), flop)
                    if est is not None and ref is not None:
                        bench.note(row, **rel_err_stats(est, ref))

    # ---------------------------------------------------------------- d) one VJP vs one forward
    def part_d():
        print(f"\n## d) one VJP (single cotangent at resid[L][-1]) vs one forward, T = {T_d}", flush=True)
        T = T_d
        ids = make_ids(T, vocab)
        cot = np.random.default_rng(1).standard_normal(d).astype(np.float32)
        ratios = {}
        _, rf = bench.measure("d", "sinklab", "Model.run(capture=())", T,
                              lambda: sl_model.run(ids, capture=(), progress=False), F(T))
        if has["vjp"]:
            _, rv = bench.measure("d", "sinklab", "Model.vjp (all layers)", T,
                                  lambda: sl_model.vjp(ids, cot, at=(L, -1)), 2 * F(T))
            if "seconds" in rf and "seconds" in rv:
                ratios["sinklab"] = rv["seconds"] / rf["seconds"]
                bench.note(rv, vjp_over_forward=ratios["sinklab"])
        if stream is not None:
            x = stream.embed(ids)
            tcot = torch.from_numpy(cot)
            _, tf = bench.measure("d", "torch", "forward (inference_mode)", T,
                                  lambda: torch_forward(torch, stream, x), F(T))
            _, tv = bench.measure("d", "torch", "forward + backward, 1 cotangent (all layers)", T,
                                  lambda: torch_vjp(torch, stream, x, tcot), 2 * F(T))
            if "seconds" in tf and "seconds" in tv:
                ratios["torch"] = tv["seconds"] / tf["seconds"]
                bench.note(tv, vjp_over_forward=ratios["torch"])

    parts = {"a": part_a, "b": part_b, "c": part_c, "d": part_d}
    for p in args.parts:  # in the order given
        parts[p]()

    if hasattr(os, "getloadavg"):
        print("\n# load average after: %.2f %.2f %.2f" % os.getloadavg())
    print_table(bench.rows, peak, n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "sgemm_peak": peak, "rows": bench.rows}, f, indent=2)


def print_table(rows: list[dict], peak: dict, n: int) -> None:
    """Markdown table; torch/sinklab = (fastest torch row of the same part and T) / this row for
    sinklab rows, this row / (fastest sinklab row) for torch rows. Part d compares like for like
    (forward with forward, VJP with VJP)."""
    def group(r: dict) -> tuple:
        if r["part"] == "d":
            return ("d", r["T"], "forward" in r["what"] and "backward" not in r["what"]
                    or "run(" in r["what"])
        return (r["part"], r["T"])

    best: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if "seconds" in r and "reference" not in r["what"]:
            g = best.setdefault(group(r), {})
            g[r["lib"]] = min(g.get(r["lib"], float("inf")), r["seconds"])
    print(f"\n{n} thread(s); measured SGEMM peak {peak['peak']:.1f} GFLOP/s ({peak['shape']}: "
          + ", ".join(f"{k} {v:.1f}" for k, v in peak.items() if k not in ("shape", "peak")) + ")")
    print("| part | T | library | what | seconds (runs) | TFLOP | GFLOP/s | of SGEMM peak "
          "| peak RSS growth (MiB) | torch/sinklab | notes |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|")
    skip = {"part", "lib", "what", "T", "seconds", "times", "flop", "gflops", "mem_delta_mb",
            "peak_rss_mb", "of_peak", "error"}
    for r in rows:
        if "error" in r:
            print(f"| {r['part']} | {r['T']} | {r['lib']} | {r['what']} | {r['error']} | | | | | | |")
            continue
        g = best.get(group(r), {})
        ratio = ""
        if "torch" in g and "sinklab" in g:
            ratio = (g["torch"] / r["seconds"]) if r["lib"] == "sinklab" else (r["seconds"] / g["sinklab"])
            ratio = f"{ratio:.2f}x"
        notes = "; ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in r.items() if k not in skip)
        fl = f"{r['flop'] / 1e12:.3g}" if r.get("flop") else ""
        gf = f"{r['gflops']:.1f}" if r.get("gflops") else ""
        op = f"{r['of_peak']:.0%}" if r.get("of_peak") else ""
        print(f"| {r['part']} | {r['T']} | {r['lib']} | {r['what']} | {r['seconds']:.3f} ({len(r['times'])}) "
              f"| {fl} | {gf} | {op} | {r['mem_delta_mb']:.0f} | {ratio} | {notes} |")


if __name__ == "__main__":
    main()
