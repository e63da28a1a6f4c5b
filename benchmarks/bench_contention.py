#!/usr/bin/env python
"""Threads under contention: sinklab with one of the machine's cores busy with another process.

On a shared node or a laptop another process often holds a core. An OpenMP team whose threads
wait for each other at many small barriers then stalls whenever the thread that shares its core
with that process is descheduled. This measures it, per workload and thread count:

    idle   no other load
    busy   one extra process spinning (``while True: pass``) for the whole measurement, placed
           by the OS scheduler like any other process (not pinned)

Workloads (SmolLM2-135M-Instruct, fp32, the same ids for every run):
    prompts   32 prompts x 64 tokens, capture="attn" (every layer's attention probabilities),
              as one (32, 64) batch
    T512      one sequence of 512 tokens, logits of the last position only
    (--torch adds transformers eager with the same workloads, torch.set_num_threads(n))

The goal of issue 9: with one core busy, a 2-thread run takes <= 1.1x its 1-thread time.
Each variant (an environment such as OMP_WAIT_POLICY=active, given with --variant) runs in its own
child process, since libgomp reads its settings when it is loaded. Times are the median of
--repeats runs after one warm-up.

    python benchmarks/bench_contention.py [--repeats 3] [--torch] [--variant OMP_WAIT_POLICY=active]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from machine import cpu_name  # noqa: E402


def workloads(vocab: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return {"prompts": (rng.integers(0, vocab, size=(32, 64)), "attn", 0),
            "T512": (rng.integers(0, vocab, size=512), "logits", -1)}


def child(args) -> None:
    """Runs every workload at 1 and 2 threads in this process; prints one JSON line."""
    import sinklab as sl

    model = sl.load("smollm2-135m-instruct")
    hf = None
    if args.torch:
        import torch
        from transformers import AutoModelForCausalLM

        path = model.source
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                  torch_dtype=torch.float32, attn_implementation="eager").eval()
    out = {}
    for name, (ids, capture, logits_from) in workloads(model.config.vocab_size).items():
        for threads in (1, 2):
            sl.set_num_threads(threads)

            def run_sl():
                model.run(ids, capture=capture, logits_from=logits_from, progress=False)

            fns = {"sinklab": run_sl}
            if hf is not None:
                import torch

                def run_hf():
                    torch.set_num_threads(threads)
                    with torch.inference_mode():
                        x = torch.as_tensor(ids.reshape(-1, ids.shape[-1]))
                        hf(x, output_attentions=capture == "attn", use_cache=False,
                           logits_to_keep=1 if logits_from == -1 else 0)

                fns["transformers"] = run_hf
            for tool, fn in fns.items():
                fn()  # warm-up
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                out[f"{name}/{tool}/{threads}"] = statistics.median(times)
    print(json.dumps(out))


def measure(variant: dict, busy: bool, args) -> dict:
    env = dict(os.environ, **variant)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        time.sleep(0.5 if busy else 0)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--repeats", str(args.repeats)]
        if args.torch:
            cmd.append("--torch")
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        return json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch", action="store_true", help="also time transformers eager")
    p.add_argument("--variant", action="append", default=[],
                   help="KEY=VAL[,KEY=VAL]: an extra environment to compare (default: as installed)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    import sinklab as sl

    flags = ""
    try:
        flags = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        flags = next((l for l in flags.splitlines() if l.startswith("Flags")), "")
    except OSError:
        pass
    print(f"# cpu={cpu_name()}, cores={os.cpu_count()}, sinklab={sl.__version__}, simd={sl.simd()}")
    print(f"# {flags}")
    variants = [{}] + [dict(kv.split("=", 1) for kv in v.split(",")) for v in args.variant]
    for variant in variants:
        label = ",".join(f"{k}={v}" for k, v in variant.items()) or "default"
        print(f"\n## variant: {label}  (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')} in parent)")
        idle, busy = measure(variant, False, args), measure(variant, True, args)
        print(f"{'workload':10} {'tool':13} {'idle 1t':>8} {'idle 2t':>8} {'busy 1t':>8} {'busy 2t':>8} "
              f"{'busy 2t/1t':>10}")
        for key in sorted({k.rsplit('/', 1)[0] for k in idle}):
            w, tool = key.split("/")
            i1, i2, b1, b2 = idle[f"{key}/1"], idle[f"{key}/2"], busy[f"{key}/1"], busy[f"{key}/2"]
            print(f"{w:10} {tool:13} {i1:8.2f} {i2:8.2f} {b1:8.2f} {b2:8.2f} {b2 / b1:10.2f}")


if __name__ == "__main__":
    main()
