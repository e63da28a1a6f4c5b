"""Memory safety of the C core: valgrind memcheck over the analyses on a tiny model, and resident
memory staying flat over repeated forward passes and repeated failed loads.

    python benchmarks/memcheck.py valgrind            # memcheck: forward, vjp, loss_and_grad,
                                                      # a Jacobian, one training step (~2-4 min)
    python benchmarks/memcheck.py rss                 # 1,000 forwards of SmolLM2 (T = 16) and
                                                      # 1,000 failed loads of a truncated GGUF
    python benchmarks/memcheck.py rss --iters 200     # shorter
    python benchmarks/memcheck.py all

Use the normal build (not SINKLAB_SANITIZE: valgrind and ASan do not mix). valgrind runs
``valgrind --leak-check=full --errors-for-leak-kinds=definite`` with ``PYTHONMALLOC=malloc`` (so
that every Python object is a malloc block valgrind can track) on this script's ``workload``
mode, and reads the XML report: errors and definitely-lost bytes are *attributed to sinklab*
when a frame of their stack lies in sinklab/_core*.so; the rest (CPython's and NumPy's own
one-time allocations, which never shrink by design) are counted apart. Under valgrind the CPU
reports no AVX-512 (valgrind cannot run it), so the AVX2+FMA kernels are what is checked.

RSS: VmRSS from /proc/self/status after a warm-up (the first 10% of iterations, at least 20:
allocator pools and NumPy caches fill) and at the end; flat means |end - warm| / warm <= 1%.
Each mode prints a Markdown table and the command that produced it.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import Callable, Dict, List, Tuple

import numpy as np

RSS_TOLERANCE = 0.01


# ------------------------------------------------------------------ the tiny model's workload

def tiny_trainer(seed: int = 0):
    """A 2-layer LLaMA-style model (V 384, d 64, 4 heads, 2 kv heads, context 48), as in
    tests/test_train_engine.py: small enough for valgrind (~50x slower than native)."""
    from sinklab.train import AdamW, Trainer, llama_config
    cfg = llama_config(vocab_size=384, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context_length=48)
    return Trainer(cfg, seed=seed, init_std=0.08, optimizer=AdamW(weight_decay=0.1, grad_clip=1.0))


def workload(repeats: int = 2) -> None:
    """forward (all captures), vjp, loss_and_grad, a Jacobian block and one AdamW step, each
    ``repeats`` times (a leak per call then shows as more than one block)."""
    tr = tiny_trainer()
    m = tr.model
    rng = np.random.default_rng(0)
    T, d = 24, m.config.d_model
    ids = rng.integers(0, m.config.vocab_size, size=T).astype(np.int64)
    for _ in range(repeats):
        out = m.run(ids, capture=("attn", "resid", "logits", "stats", "q", "k", "v", "z", "head_out", "attn_out", "mlp_out"))
        assert np.all(np.isfinite(out.logits)) and np.all(np.isfinite(out.attn))
        g = m.vjp(ids, rng.standard_normal((2, d)).astype(np.float32), at=(1, [3, T - 1]))
        assert np.all(np.isfinite(g))
        loss, grads = m.loss_and_grad(ids)
        assert np.isfinite(loss) and all(np.all(np.isfinite(v)) for v in grads.values())
        J = m.jacobian(ids, of=(2, T - 1), wrt=0, progress=False)
        assert np.all(np.isfinite(J))
        B = 2
        batch = rng.integers(0, m.config.vocab_size, size=(B, T + 1)).astype(np.int64)
        loss, gnorm = tr.step(batch[:, :-1], batch[:, 1:], lr=1e-3)
        assert np.isfinite(loss) and np.isfinite(gnorm)
    del tr, m, out, g, grads, J
    gc.collect()
    print("workload: done", flush=True)


def _is_sinklab_frame(frame: ET.Element) -> bool:
    """A frame in sinklab's extension: its object is sinklab/_core*.so or its source lies in
    csrc/ (NumPy's numpy/_core/ must not match)."""
    obj = frame.findtext("obj") or ""
    return (os.path.basename(obj).startswith("_core.") and os.path.basename(os.path.dirname(obj)) == "sinklab"
            or os.path.basename(frame.findtext("dir") or "") == "csrc")


def parse_valgrind_xml(path: str) -> Dict[str, int]:
    """Errors and definitely-lost bytes in a valgrind XML report, in total and with a stack
    frame in sinklab's extension (an ``obj`` naming ``_core``)."""
    root = ET.parse(path).getroot()
    r = {"errors": 0, "errors_sinklab": 0, "definite_bytes": 0, "definite_bytes_sinklab": 0,
         "definite_records": 0, "definite_records_sinklab": 0, "possible_bytes": 0,
         "possible_bytes_sinklab": 0}
    for e in root.iter("error"):
        kind = e.findtext("kind") or ""
        ours = any(_is_sinklab_frame(f) for f in e.iter("frame"))
        leaked = int(e.findtext("xwhat/leakedbytes") or 0)
        if kind == "Leak_DefinitelyLost":
            r["definite_bytes"] += leaked
            r["definite_records"] += 1
            if ours:
                r["definite_bytes_sinklab"] += leaked
                r["definite_records_sinklab"] += 1
        elif kind.startswith("Leak_"):
            if kind == "Leak_PossiblyLost":
                r["possible_bytes"] += leaked
                r["possible_bytes_sinklab"] += leaked * ours
        else:
            r["errors"] += 1
            r["errors_sinklab"] += int(ours)
    return r


def run_valgrind(keep: str = "") -> Dict[str, int]:
    """Runs :func:`workload` under memcheck in a child process; returns the parsed counts."""
    if shutil.which("valgrind") is None:
        raise SystemExit("memcheck: valgrind is not installed (apt-get install valgrind)")
    tmp = tempfile.mkdtemp(prefix="sinklab-memcheck-")
    xml = os.path.join(tmp, "memcheck.xml")
    cmd = ["valgrind", "--tool=memcheck", "--leak-check=full", "--errors-for-leak-kinds=definite",
           "--num-callers=30", "--xml=yes", f"--xml-file={xml}",
           sys.executable, os.path.abspath(__file__), "workload"]
    env = dict(os.environ, PYTHONMALLOC="malloc", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or "workload: done" not in proc.stdout:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"memcheck: the workload failed under valgrind (exit {proc.returncode})")
    r = parse_valgrind_xml(xml)
    r["wall_s"] = round(wall, 1)
    if keep:
        shutil.copy(xml, keep)
    shutil.rmtree(tmp, ignore_errors=True)
    print("| workload (tiny LLaMA: V 384, d 64, L 2, T 24; x2) | errors (sinklab / all) "
          "| definitely lost, bytes (sinklab / all) | possibly lost, bytes (sinklab / all) | wall |")
    print("|---|---|---|---|---|")
    print(f"| forward (all captures), vjp, loss_and_grad, Jacobian, 1 AdamW step (B 2) "
          f"| {r['errors_sinklab']} / {r['errors']} "
          f"| {r['definite_bytes_sinklab']} / {r['definite_bytes']} "
          f"| {r['possible_bytes_sinklab']} / {r['possible_bytes']} "
          f"| {wall:.0f} s |")
    print("\nOutside sinklab: CPython's and NumPy's one-time allocations at start-up and import (module"
          " tables, interned objects), and valgrind's known false positives on CPython's integer and"
          " frame code; sinklab's possibly-lost bytes, if any, are the OpenMP pool threads' TLS, alive"
          " until exit.")
    print(f"command: PYTHONMALLOC=malloc {' '.join(cmd[:5])} --xml=yes "
          f"python benchmarks/memcheck.py workload")
    return r


# ------------------------------------------------------------------ RSS

def rss_bytes() -> int:
    """This process's resident set (VmRSS), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def rss_flat(step: Callable[[int], None], iters: int, warmup: int = 0) -> Tuple[int, int, float]:
    """(RSS after warm-up, RSS at the end, relative change) over ``iters`` calls of step(i);
    warm-up: the first max(20, iters // 10) calls."""
    warmup = warmup or max(20, iters // 10)
    warm = 0
    for i in range(iters):
        step(i)
        if i + 1 == warmup:
            gc.collect()
            warm = rss_bytes()
    gc.collect()
    end = rss_bytes()
    return warm, end, (end - warm) / warm


def truncated_gguf(src: str, dst_dir: str) -> List[str]:
    """Truncated copies of the GGUF ``src``: inside the metadata (4 KiB) and inside the tensor
    data (2 MiB)."""
    out = []
    with open(src, "rb") as f:
        head = f.read(2 << 20)
    for n in (4 << 10, 2 << 20):
        p = os.path.join(dst_dir, f"truncated-{n}.gguf")
        with open(p, "wb") as f:
            f.write(head[:n])
        out.append(p)
    return out


def run_rss(iters: int = 1000, T: int = 16) -> List[Dict[str, float]]:
    """RSS over ``iters`` forwards of SmolLM2-135M (T tokens, default captures) and ``iters``
    failed loads of truncated GGUF files (alternating the two truncations)."""
    import sinklab
    from sinklab.io import registry
    path = str(registry.fetch("smollm2-135m-instruct"))
    model = sinklab.load(path, quiet=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, size=T).astype(np.int64)

    def forward(i: int) -> None:
        model.run(ids)

    tmp = tempfile.mkdtemp(prefix="sinklab-rss-")
    bad = truncated_gguf(path, tmp)
    errors: Dict[str, int] = {}

    def failed_load(i: int) -> None:
        try:
            sinklab.load(bad[i % len(bad)], quiet=True)
        except (ValueError, OSError) as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
        else:
            raise AssertionError(f"{bad[i % len(bad)]} loaded")

    rows = []
    try:
        for name, step in ((f"forward, SmolLM2-135M Q4_1, T = {T}", forward),
                           ("failed load, truncated GGUF (metadata / tensor data)", failed_load)):
            t0 = time.perf_counter()
            warm, end, rel = rss_flat(step, iters)
            rows.append({"case": name, "iters": iters, "warm": warm, "end": end, "rel": rel,
                         "wall": time.perf_counter() - t0})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| case | iterations | RSS after warm-up | RSS at end | change | flat (±1%) | wall |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['iters']} | {r['warm'] / 2**20:.1f} MiB | {r['end'] / 2**20:.1f} MiB "
              f"| {100 * r['rel']:+.2f}% | {'yes' if abs(r['rel']) <= RSS_TOLERANCE else 'NO'} "
              f"| {r['wall']:.0f} s |")
    print(f"\nexceptions of the failed loads: {errors}")
    print(f"command: python benchmarks/memcheck.py rss --iters {iters}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["valgrind", "rss", "all", "workload"])
    ap.add_argument("--iters", type=int, default=1000, help="RSS iterations per case (default 1000)")
    ap.add_argument("--keep-xml", default="", help="copy valgrind's XML report here")
    a = ap.parse_args(argv)
    if a.mode == "workload":
        workload()
        return 0
    ok = True
    if a.mode in ("valgrind", "all"):
        r = run_valgrind(a.keep_xml)
        ok &= r["errors_sinklab"] == 0 and r["definite_bytes_sinklab"] == 0
    if a.mode in ("rss", "all"):
        rows = run_rss(a.iters)
        ok &= all(abs(r["rel"]) <= RSS_TOLERANCE for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
