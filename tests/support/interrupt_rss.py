"""The interrupted-calls RSS runner shared by tests/test_rss.py (a short run) and
benchmarks/bench_interrupt.py (the long version): a child process runs forwards and
loss_and_grads stopped by SIGINT and prints its RSS after each round."""
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}

RSS_CHILD = textwrap.dedent("""
    import gc, json, os, signal, sys, threading, time
    import numpy as np
    import sinklab as sl

    def rss():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

    try:  # glibc keeps freed heap memory (the OpenMP threads' arenas) for reuse; trimming returns it
        import ctypes
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        trim = lambda pad: 0

    model = sl.load(sys.argv[1], quiet=True)
    T, n = int(sys.argv[2]), int(sys.argv[3])
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, T)
    calls = {"forward": lambda: model.run(ids, capture=("stats",)), "loss_and_grad": lambda: model.loss_and_grad(ids)}
    secs = {}
    for name, call in calls.items():  # warm-up, uninterrupted: the workspace and caches at full size
        t = time.perf_counter()
        call()
        secs[name] = time.perf_counter() - t
    warm = rss()
    fractions = (0.1, 0.2, 0.3, 0.4)  # of the call's duration: stopped at varied points

    def interrupted(call, delay):
        done = threading.Event()
        th = threading.Thread(target=lambda: done.wait(delay) or os.kill(os.getpid(), signal.SIGINT))
        th.start()
        try:
            try:
                call()
                return 0
            finally:
                done.set()
                th.join()
        except KeyboardInterrupt:
            return 1

    hits, raw, series = 0, [], []
    for i in range(n):
        for name, call in calls.items():
            hits += interrupted(call, fractions[i % len(fractions)] * secs[name])
        gc.collect()
        raw.append(rss())
        trim(0)
        series.append(rss())
    print(json.dumps({"hits": hits, "calls": len(calls) * n, "rss": series, "rss_untrimmed": raw, "warm_rss": warm,
                      "call_s": secs}))
""")


def interrupted_rss(gguf: Any, T: int, n: int) -> Dict[str, Any]:
    """RSS (bytes) after each of ``n`` rounds of a forward (capture "stats") and a loss_and_grad
    of ``T`` tokens on ``gguf``, each stopped by SIGINT from a timer thread (caught) at 10-40%
    of its uninterrupted duration, after one uninterrupted warm-up of each; in a subprocess.

    Returns ``hits`` (calls that did stop), ``calls``, ``rss`` (read after glibc's
    ``malloc_trim(0)``: what is still allocated), ``rss_untrimmed`` (without it: glibc's arenas
    keep freed gradient buffers for reuse, ~450 MB on SmolLM2, so RSS steps up over the first
    rounds and then stays flat; not a leak, but it would hide one), ``warm_rss`` and ``call_s``
    (the warm-up calls' seconds)."""
    r = subprocess.run([sys.executable, "-c", RSS_CHILD, str(gguf), str(T), str(n)], capture_output=True, text=True,
                       env=ENV, timeout=7200)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])
