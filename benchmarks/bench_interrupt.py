#!/usr/bin/env python
"""Ctrl-C: seconds from SIGINT to KeyboardInterrupt (or to process exit), and the memory of
interrupted calls (issue 13).

Parts (each case in a subprocess, so that no SIGINT reaches this process):

0. The longest stretch without a Ctrl-C check in uninterrupted calls (the core times them):
   forward T with logits, loss_and_grad T, vjp and jvp T_jvp, the Jacobian at T = 256, one
   training step of the default-size model; this bounds the latency wherever the SIGINT lands.
1. C calls on SmolLM2-135M (the GGUF of the registry): forward T (capture "stats"), the
   Jacobian of the last position's output over T_jac tokens, a jvp over T_jvp tokens and
   loss_and_grad T; SIGINT from a timer thread ``--delay`` s into the call; seconds until
   the call raised KeyboardInterrupt. Each repeated ``--reps`` times (median and max).
2. A training run (``sinklab train``), SIGINT and SIGTERM (``kill``: handled as Ctrl-C), of two
   sizes: ``small`` (d 32, 2 layers, C 32: steps of
   milliseconds) and ``default`` (``sinklab train --example``'s model: d 256, 4 layers, C 256,
   8192 tokens a step); SIGINT ``--train-wait`` s after start; seconds to process exit, and the
   duration of one optimizer step (a step is atomic until the C step checks for Ctrl-C inside
   its gradient workers: then the figure is bounded by it).
3. A sweep (``sinklab sweep``) of 4 sink-study tasks: serial, and on a new 2-worker
   LocalCluster (SIGINT to the whole process group, as a terminal sends it); seconds from the
   SIGINT, sent once the first result is written, to process exit. Also what a graceful
   ``LocalCluster.close()`` with 2 running tasks takes (the interrupt path kills the workers
   instead).
4. Memory: RSS of a process running a forward (capture "stats") and a loss_and_grad of T tokens,
   each stopped by SIGINT at 10-40% of its duration, ``--rss-rounds`` rounds after one
   uninterrupted warm-up; RSS after each round, after glibc's malloc_trim(0) (memory still
   allocated) and without it (what glibc keeps for reuse). tests/test_rss.py runs the CI size.

Parts 1-3 run twice: idle, and with one core busy (a busy-loop process). Prints lscpu's model,
cores, caches and SIMD flags first. ``--quick`` runs everything at small sizes (a check that the
script works, not figures). ``--json PATH`` also writes the figures.

    python benchmarks/bench_interrupt.py            # the figures (several minutes on 2 cores)
    python benchmarks/bench_interrupt.py --quick
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Dict, List, Optional

# run from a checkout without installing: the package sits one folder up
_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.dirname(_HERE), _HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from machine import cpu_name, lscpu_lines  # noqa: E402
from tests.support.interrupt_rss import interrupted_rss  # noqa: E402  (shared with tests/test_rss.py)

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}

# ------------------------------------------------------------------------------------ C calls
CALLS_CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import numpy as np
    import sinklab as sl
    import tqdm.auto  # noqa: F401  (the calls' lazy import, done here: a SIGINT inside an import is Python's case, not ours)

    gguf, T, T_jac, T_jvp, delay, reps = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5]), int(sys.argv[6])
    model = sl.load(gguf, quiet=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, max(T, T_jac, T_jvp))
    d = model.config.d_model
    calls = {
        f"forward T={T}": lambda: model.run(ids[:T], capture=("stats",)),
        f"jacobian T={T_jac}": lambda: model.jacobian(ids[:T_jac], of=(model.config.n_layers, T_jac - 1), progress=False),
        f"jvp T={T_jvp}": lambda: model.jvp(ids[:T_jvp], np.ones((T_jvp, d), np.float32), at=0),
        f"loss_and_grad T={T}": lambda: model.loss_and_grad(ids[:T]),
    }
    out = {}
    for name, call in calls.items():
        lat = []
        for _ in range(reps):
            sent, done = {}, threading.Event()
            def fire():
                if not done.wait(delay):
                    sent["t"] = time.perf_counter()
                    os.kill(os.getpid(), signal.SIGINT)
            th = threading.Thread(target=fire)
            th.start()
            result, stopped = "finished", None
            try:
                try:
                    call()
                except KeyboardInterrupt:
                    result, stopped = "KeyboardInterrupt", time.perf_counter()
                finally:
                    done.set()
                    th.join()
            except KeyboardInterrupt:  # a SIGINT that fired just as the call finished
                pass
            lat.append(stopped - sent["t"] if result == "KeyboardInterrupt" else None)
        out[name] = lat
    print(json.dumps(out))
""")


def c_calls(gguf: str, T: int, T_jac: int, T_jvp: int, delay: float, reps: int) -> Dict[str, List[Optional[float]]]:
    """{call: [seconds from SIGINT to KeyboardInterrupt, or None when the call finished first]}."""
    r = subprocess.run([sys.executable, "-c", CALLS_CHILD, gguf, str(T), str(T_jac), str(T_jvp), str(delay), str(reps)],
                       capture_output=True, text=True, env=ENV, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


GAPS_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import sinklab as sl
    from sinklab import _core
    from sinklab.train import Trainer, llama_config

    gguf, T, T_jac, T_jvp = sys.argv[1], *map(int, sys.argv[2:5])
    model = sl.load(gguf, quiet=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, max(T, T_jac, T_jvp))
    d, L = model.config.d_model, model.config.n_layers
    tr = Trainer(llama_config(vocab_size=4096, d_model=256, n_layers=4, n_heads=4, context_length=256), seed=0)
    batch = np.random.default_rng(1).integers(0, 4096, (32, 257))
    calls = {
        f"forward + logits T={T}": lambda: model.run(ids[:T], capture=("logits", "stats")),
        f"loss_and_grad T={T}": lambda: model.loss_and_grad(ids[:T]),
        f"vjp T={T_jvp}": lambda: model.vjp(ids[:T_jvp], np.ones((T_jvp, d), np.float32), at=L),
        f"jvp T={T_jvp}": lambda: model.jvp(ids[:T_jvp], np.ones((T_jvp, d), np.float32), at=0),
        f"jacobian T={T_jac}": lambda: model.jacobian(ids[:T_jac], of=(L, T_jac - 1), progress=False),
        "train step 32 x 256 (d 256, 4 layers)": lambda: tr.step(batch[:, :-1], batch[:, 1:], lr=1e-3),
    }
    out = {}
    for name, call in calls.items():
        call()
        out[name] = _core._interrupt_check_gaps()
    print(json.dumps(out))
""")


def check_gaps(gguf: str, T: int, T_jac: int, T_jvp: int) -> Dict[str, List[float]]:
    """{call: [Ctrl-C checks, longest seconds without one]} of uninterrupted calls: the latency
    bound wherever the SIGINT lands (the core times the stretches between its checks)."""
    r = subprocess.run([sys.executable, "-c", GAPS_CHILD, gguf, str(T), str(T_jac), str(T_jvp)],
                       capture_output=True, text=True, env=ENV, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ processes
def _ctrl_c(proc: subprocess.Popen, group: bool, sig: int = signal.SIGINT) -> float:
    """SIGINT (or ``sig``) to the process (or its group); seconds until it exited."""
    t = time.perf_counter()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return float("inf")
    return time.perf_counter() - t


def _cli(argv: List[str], extra_env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sinklab.cli", "--quiet", *argv], start_new_session=True,
                            env={**ENV, **(extra_env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _leftovers(folder: str) -> List[str]:
    return [os.path.join(d, n) for d, ds, fs in os.walk(folder) for n in ds + fs if ".tmp" in n]


def train_run(size: str, wait: float, tmp: str, quick: bool, sig: int = signal.SIGINT) -> Dict[str, Any]:
    """One ``sinklab train`` run sent ``sig`` (SIGINT; SIGTERM is handled the same way) ``wait`` s
    after its start."""
    from sinklab.train.run import TrainConfig

    cfg = TrainConfig().to_dict()
    if size == "small":
        cfg.update(d_model=32, n_layers=2, n_heads=2, context=32, tokens_per_step=128, eval_every=50,
                   checkpoint_every=10, eval_docs=4, eval_windows=2)
    cfg.update(steps=100000, out_dir=os.path.join(tmp, f"train-{size}"))
    if quick and size == "default":
        cfg.update(tokens_per_step=cfg["context"] * 4)
    path = os.path.join(tmp, f"train-{size}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = _cli(["train", path, "--no-resume"], {"SINKLAB_TEST_STEP_PAUSE": ""})
    time.sleep(wait)
    secs = _ctrl_c(p, group=False, sig=sig)
    err = p.stderr.read()
    log = os.path.join(cfg["out_dir"], "log.jsonl")
    return {"size": size, "signal": signal.Signals(sig).name, "exit_s": secs, "rc": p.returncode, "message": err.strip().splitlines()[-1:],
            "leftovers": _leftovers(cfg["out_dir"]), "log_lines": sum(1 for _ in open(log)) if os.path.exists(log) else 0}


def step_seconds(size: str, quick: bool) -> float:
    """Seconds of one optimizer step of the run ``train_run(size)`` makes (best of 3)."""
    import numpy as np

    from sinklab.train import Trainer, llama_config
    from sinklab.train.run import TrainConfig

    c = TrainConfig()
    d, L, H, C, tps = (32, 2, 2, 32, 128) if size == "small" else (c.d_model, c.n_layers, c.n_heads, c.context,
                                                                   c.tokens_per_step if not quick else c.context * 4)
    tr = Trainer(llama_config(c.vocab_size, d_model=d, n_layers=L, n_heads=H, context_length=C), seed=0)
    b = np.random.default_rng(0).integers(0, c.vocab_size, size=(tps // C, C + 1))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        tr.step(b[:, :-1], b[:, 1:], 1e-3)
        best = min(best, time.perf_counter() - t)
    return best


SPEC = {"analysis": ["sink_study"], "model": ["smollm2-135m-instruct"], "bos": [True, False], "T": [48, 64],
        "eps": [0.3], "settings": {"sink_study": {"n_prompts": 40}}}


def sweep_run(mode: str, tmp: str) -> Dict[str, Any]:
    """``sinklab sweep`` of SPEC (serial or 2 workers), SIGINT to its group after the first result."""
    out = os.path.join(tmp, f"sweep-{mode}")
    shutil.rmtree(out, ignore_errors=True)
    spec = os.path.join(tmp, "spec.json")
    with open(spec, "w") as f:
        json.dump(SPEC, f)
    args = ["--serial"] if mode == "serial" else ["--workers", "2"]
    p = _cli(["--threads", "1", "sweep", spec, "--out", out, *args])
    tasks = os.path.join(out, "tasks")
    t0 = time.time()
    while p.poll() is None and time.time() - t0 < 600:
        if os.path.isdir(tasks) and any(n.endswith(".json") for n in os.listdir(tasks)):
            break
        time.sleep(0.01)
    workers = _children(p.pid)
    secs = _ctrl_c(p, group=True)
    err = p.stderr.read()
    time.sleep(2.0)
    alive = [w for w in workers if _alive(w)]
    running = os.listdir(os.path.join(out, "running")) if os.path.isdir(os.path.join(out, "running")) else []
    return {"mode": mode, "exit_s": secs, "rc": p.returncode, "message": err.strip().splitlines()[-1:],
            "leftovers": _leftovers(out) + running, "processes_left": alive}


def _children(pid: int) -> List[int]:
    kids = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                with open(f"/proc/{n}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(n))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


GRACEFUL_CHILD = textwrap.dedent("""
    import logging, time, sys
    import distributed
    if __name__ == "__main__":
        cl = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      silence_logs=logging.ERROR, dashboard_address=":0")
        c = distributed.Client(cl)
        futs = [c.submit(time.sleep, 30, pure=False) for _ in range(2)]
        time.sleep(1.0)
        t = time.perf_counter()
        c.close()
        cl.close()
        print(time.perf_counter() - t)
""")


def graceful_close() -> float:
    """Seconds a graceful client + LocalCluster close takes with 2 tasks running."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GRACEFUL_CHILD)
    try:
        r = subprocess.run([sys.executable, f.name], capture_output=True, text=True, env=ENV, timeout=300)
        return float(r.stdout.strip().splitlines()[-1])
    finally:
        os.remove(f.name)


# ------------------------------------------------------------------------------------ memory

# ------------------------------------------------------------------------------------ main
class BusyCore:
    """A busy-loop process on one core for the duration of a ``with`` block."""

    def __enter__(self) -> "BusyCore":
        self.p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: Any) -> None:
        self.p.kill()
        self.p.wait()


def _fmt(xs: List[Optional[float]]) -> str:
    got = [x for x in xs if x is not None]
    if not got:
        return "finished before the SIGINT (raise T or lower --delay)"
    extra = f", {len(xs) - len(got)} finished first" if len(got) < len(xs) else ""
    return f"median {statistics.median(got):.3f} s, max {max(got):.3f} s over {len(got)}{extra}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: checks that the script runs")
    ap.add_argument("--T", type=int, default=None, help="tokens of the forward and loss_and_grad (8192)")
    ap.add_argument("--reps", type=int, default=None, help="interrupts per C call (3)")
    ap.add_argument("--delay", type=float, default=None, help="seconds into a C call the SIGINT comes (1.0)")
    ap.add_argument("--train-wait", type=float, default=None, help="seconds into a training run (12)")
    ap.add_argument("--rss-rounds", type=int, default=None, help="rounds of (forward, loss_and_grad) interrupted (10)")
    ap.add_argument("--no-dask", action="store_true", help="skip the LocalCluster sweep")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    q = a.quick
    T = a.T or (256 if q else 8192)
    T_jac, T_jvp = (64, 128) if q else (2048, 4096)
    reps = a.reps or (1 if q else 3)
    delay = a.delay or (0.1 if q else 1.0)
    wait = a.train_wait or (5.0 if q else 12.0)
    rounds = a.rss_rounds or (2 if q else 10)

    import sinklab
    from sinklab.io import registry

    print(f"CPU: {cpu_name()}; {os.cpu_count()} logical CPUs")
    for line in lscpu_lines():
        print("  " + line)
    print(f"sinklab {sinklab.__version__} (kernels {sinklab.simd()}), threads {sinklab.get_num_threads()}"
          + (f"; load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}" if hasattr(os, "getloadavg") else ""))
    if q:
        print("--quick: small sizes, not figures")
    gguf = str(registry.fetch("smollm2-135m-instruct"))
    have_dask = not a.no_dask
    if have_dask:
        try:
            import distributed  # noqa: F401
        except ImportError:
            have_dask = False
            print("(no distributed: the LocalCluster sweep is skipped)")
    figures: Dict[str, Any] = {"T": T, "T_jac": T_jac, "T_jvp": T_jvp, "delay": delay, "reps": reps}
    steps = {s: step_seconds(s, q) for s in ("small", "default")}
    figures["train_step_s"] = steps
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("idle", "one core busy"):
            print(f"\n== {load}")
            with contextlib.nullcontext() if load == "idle" else BusyCore():
                part: Dict[str, Any] = {}
                gaps = check_gaps(gguf, T, 64 if q else 256, T_jvp)
                print("Longest stretch without a Ctrl-C check (uninterrupted calls; bounds the latency):")
                for name, (n, longest) in gaps.items():
                    print(f"  {name:38s} {longest:.3f} s ({n} checks)")
                part["check_gaps"] = gaps
                calls = c_calls(gguf, T, T_jac, T_jvp, delay, reps)
                print(f"C calls, SIGINT {delay:g} s in -> KeyboardInterrupt:")
                for name, lat in calls.items():
                    print(f"  {name:24s} {_fmt(lat)}")
                part["calls"] = calls
                part["train"] = []
                for size, sig in ((z, g) for z in ("small", "default") for g in (signal.SIGINT, signal.SIGTERM)):
                    r = train_run(size, wait, tmp, q, sig)
                    part["train"].append(r)
                    print(f"sinklab train ({size}, one step {steps[size]:.3f} s), {r['signal']} {wait:g} s in -> exit "
                          f"{r['rc']}: {r['exit_s']:.3f} s; {r['log_lines']} log line(s); half-written files left: "
                          f"{len(r['leftovers'])}; {' '.join(r['message'])}")
                part["sweep"] = []
                for mode in ("serial", "dask") if have_dask else ("serial",):
                    r = sweep_run(mode, tmp)
                    part["sweep"].append(r)
                    print(f"sinklab sweep ({'serial' if mode == 'serial' else 'LocalCluster 2 workers'}), SIGINT to the "
                          f"group after the first result -> exit {r['rc']}: {r['exit_s']:.3f} s; files left: "
                          f"{len(r['leftovers'])}; processes left: {len(r['processes_left'])}")
                figures[load] = part
        if have_dask:
            figures["graceful_close_s"] = graceful_close()
            print(f"\na graceful client + LocalCluster close with 2 running tasks: {figures['graceful_close_s']:.2f} s "
                  f"(the Ctrl-C path kills the workers instead)")
    print(f"\n== memory: {rounds} rounds of (forward, loss_and_grad) at T={T}, each stopped by SIGINT at 10-40% "
          f"of its duration")
    res = interrupted_rss(gguf, T, rounds)
    figures["rss"] = res
    mib = [x / 2 ** 20 for x in res["rss"]]
    raw = [x / 2 ** 20 for x in res["rss_untrimmed"]]
    print(f"uninterrupted calls: forward {res['call_s']['forward']:.2f} s, loss_and_grad "
          f"{res['call_s']['loss_and_grad']:.2f} s; {res['hits']} of {res['calls']} calls stopped by the SIGINT")
    print(f"RSS after malloc_trim, MiB: after round 1 {mib[0]:.1f}, after round {rounds} {mib[-1]:.1f} "
          f"({100 * (mib[-1] - mib[0]) / mib[0]:+.2f}%), max {max(mib):.1f}")
    print(f"RSS without trimming, MiB: after round 1 {raw[0]:.1f}, after round {rounds} {raw[-1]:.1f}, max {max(raw):.1f} "
          f"(glibc keeps freed buffers for reuse)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
