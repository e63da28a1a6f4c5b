"""Quantized residency: memory and speed of GGUF matrices kept in their file encoding
(memory-mapped, decoded block by block inside the SGEMM's weight packing) against the same model
with every matrix expanded to float32 at load (the "fp32-resident" path, what sinklab did before).

    python benchmarks/bench_residency.py                         # all four models, memory + speed
    python benchmarks/bench_residency.py --models smollm2 gemma --reps 5 --threads 2
    python benchmarks/bench_residency.py --only memory           # or --only speed
    python benchmarks/bench_residency.py --smoke                 # SmolLM2, T 16/32: checks the script runs

Per model (SmolLM2-135M Q4_1, Gemma-3-270M / Qwen2.5-Coder-0.5B / 1.5B Q4_K_M):

* memory, each number from a fresh subprocess per (model, residency), so nothing else the
  process did is counted: the file size; RSS right after ``sinklab.load`` (the fp32 path then
  dequantizes every matrix and drops the quantized model); the peak RSS during one T=512 forward
  with ``capture="stats"`` (the kernel's high-water mark VmHWM, reset after load through
  /proc/self/clear_refs; where that is refused, ru_maxrss, which then includes the load). RSS is
  split into file-backed pages (RssFile: the memory map, shared, reclaimable) and anonymous ones
  (RssAnon: the process's own allocations). Mapped pages are counted once touched, so RSS after
  load is below the file size until a forward has read every matrix.
* speed: fp32-resident time / quantized time of a forward with ``capture="stats"`` at each
  --T, both models in one process on the same thread count, repetitions interleaved
  (q f f q q f ...) so drift of the machine hits both alike; the median of --reps runs per side.
  Above 1 the quantized model is faster. The goal is >= 0.9 at T >= 128. The two models'
  stats are also compared bit for bit (they must be equal: the decoder is exact).

The machine (lscpu model name and flags, threadpoolctl's pools, ``sinklab.simd()``, threads) is
printed first. Run the speed part on an otherwise idle machine; memory does not depend on load.
``--json PATH`` writes every number.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
MODELS = {  # short name -> registered name
    "smollm2": "smollm2-135m-instruct",
    "gemma": "gemma-3-270m",
    "qwen0.5": "qwen2.5-coder-0.5b-instruct",
    "qwen1.5": "qwen2.5-coder-1.5b-instruct",
}
MB = 1e6


# ----------------------------------------------------------------------------- the fp32 path
def fp32_resident(model):
    """The same model with every matrix dequantized to a float32 array (rows*cols*4 bytes each),
    as sinklab held weights before quantized residency; a tied head stays one array. Built with
    :class:`sinklab.Model`'s constructor from ``{name: model.weight(name)}``; llama3 RoPE
    factors (``rope_freqs.weight``) are read again from the GGUF file when the model has them."""
    import sinklab as sl
    from sinklab.families.rope import layer_inv_freq
    from sinklab.io import gguf_loader

    done: Dict[int, np.ndarray] = {}
    weights = {}
    for k, v in model.weights.items():
        if k == "rope_inv_freq":
            continue  # the constructor computes it
        if id(v) not in done:
            done[id(v)] = np.array(model.weight(k), dtype=np.float32, copy=True)  # own memory, not the map
        weights[k] = done[id(v)]
    factors = None
    if "rope_inv_freq" in model.weights and not np.array_equal(layer_inv_freq(model.config),
                                                                model.weights["rope_inv_freq"]):
        factors = gguf_loader.llama3_rope_factors(gguf_loader.open_gguf(model.source), model.config)
    out = sl.Model(model.config, weights, model.tokenizer, model.source, model.rope_layout,
                   rope_factors=factors, name=model.name + " (fp32-resident)")
    if "rope_inv_freq" in model.weights:
        assert np.array_equal(out.weights["rope_inv_freq"], model.weights["rope_inv_freq"])
    return out


def is_quantized(model) -> bool:
    from sinklab.families.tensors import QuantizedTensor

    return any(isinstance(v, QuantizedTensor) for v in model.weights.values())


# ----------------------------------------------------------------------------- memory
def proc_status() -> Dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process in bytes (Linux /proc/self/status)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0: writing 5 to clear_refs); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def test_ids(model, T: int, seed: int = 0) -> np.ndarray:
    """(T,) token ids: the BOS (when the model has one) then uniform random ids."""
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, size=T, dtype=np.int64)
    if model.config.bos_token_id is not None:
        ids[0] = model.config.bos_token_id
    return ids


def memory_child(path: str, resident: str, T: int, threads: Optional[int]) -> Dict[str, Any]:
    """Runs in a fresh process: load, (expand to fp32), measure, one T-token stats forward, measure."""
    import sinklab as sl

    if threads:
        sl.set_num_threads(threads)
    base = proc_status()
    t0 = time.perf_counter()
    m = sl.load(path, quiet=True)
    if resident == "f32":
        m = fp32_resident(m)  # the quantized model (and the map's Python views) is dropped
    gc.collect()
    load_s = time.perf_counter() - t0
    loaded = proc_status()
    load_peak = loaded["VmHWM"]
    peak_reset = reset_peak()
    ids = test_ids(m, T)
    t0 = time.perf_counter()
    tr = m.run(ids, capture=("stats",), progress=False)
    run_s = time.perf_counter() - t0
    after = proc_status()
    assert np.isfinite(tr.stats.importance).all()
    run_peak = after["VmHWM"] if peak_reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"model": m.name, "resident": resident, "quantized": is_quantized(m), "T": T,
            "file_bytes": os.path.getsize(path), "base": base, "after_load": loaded,
            "load_peak": load_peak, "after_run": after, "run_peak": run_peak,
            "run_peak_is_since_load": peak_reset, "load_s": load_s, "run_s": run_s}


def measure_memory(path: str, resident: str, T: int, threads: Optional[int]) -> Dict[str, Any]:
    """memory_child in a fresh interpreter; its JSON result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-memory", path, resident, str(T)]
    if threads:
        cmd += ["--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"memory child failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- speed
def measure_speed(path: str, Ts: List[int], reps: int, threads: Optional[int]) -> Dict[str, Any]:
    """Median seconds per stats forward of the quantized and the fp32-resident model, interleaved."""
    import sinklab as sl

    if threads:
        sl.set_num_threads(threads)
    mq = sl.load(path, quiet=True)
    mf = fp32_resident(mq)
    out = {"model": mq.name, "threads": sl.get_num_threads(), "T": {}}
    for T in Ts:
        ids = test_ids(mq, T)
        trq = mq.run(ids, capture=("stats",), progress=False)  # warm-up; buffers reused below
        trf = mf.run(ids, capture=("stats",), progress=False)
        equal = all(np.array_equal(getattr(trq.stats, k), getattr(trf.stats, k))
                    for k in ("importance", "to_first", "entropy"))
        times = {"q": [], "f": []}
        for r in range(reps):
            for side in (("q", "f") if r % 2 == 0 else ("f", "q")):
                m, tr = (mq, trq) if side == "q" else (mf, trf)
                t0 = time.perf_counter()
                m.run(ids, capture=("stats",), progress=False, out=tr)
                times[side].append(time.perf_counter() - t0)
        q, f = statistics.median(times["q"]), statistics.median(times["f"])
        out["T"][T] = {"quantized_s": q, "f32_s": f, "ratio": f / q, "bitwise_equal": equal,
                       "quantized_all": times["q"], "f32_all": times["f"]}
    return out


# ----------------------------------------------------------------------------- machine
def machine_info() -> Dict[str, Any]:
    import sinklab as sl

    info: Dict[str, Any] = {"simd": sl.simd(), "threads": sl.get_num_threads(), "cpus": os.cpu_count()}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in text.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "Flags"):
                info[k.strip()] = v.strip()
    except (OSError, subprocess.CalledProcessError):
        info["Model name"] = "lscpu unavailable"
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [{k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version")}
                               for p in threadpool_info()]
    except ImportError:
        info["threadpools"] = "threadpoolctl not installed"
    return info


# ----------------------------------------------------------------------------- main
def _mb(n: float) -> str:
    return f"{n / MB:8.1f}"


def print_memory(rows: List[Dict[str, Any]]) -> None:
    print("\nmemory (MB; RSS = anon + file-backed; each row a fresh process; pk load = VmHWM during load, "
          "peak run = VmHWM during the T-token run, reset after load)")
    print(f"{'model':<34} {'resident':<9} {'file':>8} {'RSS load':>8} {'anon':>8} {'file-bk':>8} {'pk load':>8} "
          f"{'peak run':>8} {'RSS run':>8} {'anon':>8} {'file-bk':>8} {'load s':>7}")
    for r in rows:
        a, b = r["after_load"], r["after_run"]
        print(f"{r['model'][:34]:<34} {r['resident']:<9} {_mb(r['file_bytes'])} {_mb(a['VmRSS'])} "
              f"{_mb(a['RssAnon'])} {_mb(a['RssFile'])} {_mb(r['load_peak'])} {_mb(r['run_peak'])} {_mb(b['VmRSS'])} "
              f"{_mb(b['RssAnon'])} {_mb(b['RssFile'])} {r['load_s']:7.1f}"
              + ("" if r["run_peak_is_since_load"] else "  (peak includes load)"))


def print_speed(s: Dict[str, Any]) -> None:
    for T, v in s["T"].items():
        print(f"{s['model'][:34]:<34} T={T:<5} quantized {v['quantized_s'] * 1e3:9.1f} ms   fp32-resident "
              f"{v['f32_s'] * 1e3:9.1f} ms   ratio {v['ratio']:.2f}x   bitwise equal: {v['bitwise_equal']}",
              flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help=f"from {list(MODELS)} or GGUF paths")
    ap.add_argument("--T", nargs="+", type=int, default=[128, 512], help="speed: tokens per forward")
    ap.add_argument("--mem-T", type=int, default=512, help="memory: tokens of the measured forward")
    ap.add_argument("--reps", type=int, default=7, help="speed: timed runs per side and T")
    ap.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: sinklab's)")
    ap.add_argument("--only", choices=("memory", "speed"), default=None)
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--smoke", action="store_true", help="SmolLM2 only, T 16/32, 2 reps")
    ap.add_argument("--child-memory", nargs=3, metavar=("PATH", "RESIDENT", "T"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child_memory:
        path, resident, T = a.child_memory
        print(json.dumps(memory_child(path, resident, int(T), a.threads)))
        return 0
    if a.smoke:
        a.models, a.T, a.mem_T, a.reps = ["smollm2"], [16, 32], 32, 2

    from sinklab.io import registry

    if a.threads:
        import sinklab as sl
        sl.set_num_threads(a.threads)
    info = machine_info()
    print(f"cpu: {info.get('Model name')}  ({info['cpus']} logical CPUs)")
    print(f"flags: {info.get('Flags', '?')}")
    print(f"sinklab.simd(): {info['simd']}   threads: {info['threads']}")
    print(f"threadpoolctl: {info['threadpools']}")
    result: Dict[str, Any] = {"machine": info, "memory": [], "speed": []}
    paths = [str(registry.fetch(MODELS[m], quiet=True)) if m in MODELS else m for m in a.models]
    if a.only in (None, "memory"):
        for p in paths:
            for resident in ("quantized", "f32"):
                result["memory"].append(measure_memory(p, resident, a.mem_T, a.threads))
        print_memory(result["memory"])
    if a.only in (None, "speed"):
        print(f"\nspeed: forward with capture='stats', median of {a.reps} interleaved runs; "
              f"ratio = fp32-resident time / quantized time (goal >= 0.9 at T >= 128)")
        for p in paths:
            s = measure_speed(p, a.T, a.reps, a.threads)
            result["speed"].append(s)
            print_speed(s)
            gc.collect()
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
