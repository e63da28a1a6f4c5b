"""Ctrl-C: a long C call stops within 1 s of SIGINT with KeyboardInterrupt.

The C core runs with the GIL released, where Python's own SIGINT handler only trips a flag
that nothing reads until the call returns. The binding installs a handler for the duration of
the call that also sets the core's interrupt flag, which the loops check between layers, (head,
query-block) attention tasks and row chunks of the output head; the call unwinds through its
error path (freeing its buffers) and Python raises KeyboardInterrupt. Each case runs in a
subprocess (so that the SIGINT never reaches pytest), which sends itself SIGINT from a timer
thread 1 s into the call and reports how long the call took to stop, then checks that the model
still gives the same numbers afterwards."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # subprocesses running T=8192 calls on SmolLM2, interrupted

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import numpy as np
    import sinklab as sl

    model = sl.load(sys.argv[1], quiet=True)
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 8192)
    small = ids[:64]
    before = model.run(small, capture=("logits",)).logits.copy()
    calls = {
        "forward T=8192": lambda: model.run(ids, capture=("stats",)),
        "jacobian T=2048": lambda: model.jacobian(ids[:2048], of=(model.config.n_layers, 2047), progress=False),
        "loss_and_grad T=8192": lambda: model.loss_and_grad(ids),
        "jvp T=4096": lambda: model.jvp(ids[:4096], np.ones((4096, model.config.d_model), np.float32), at=0),
    }
    out = {}
    for name, call in calls.items():
        sent = {}
        def fire():
            time.sleep(1.0)
            sent["t"] = time.perf_counter()
            os.kill(os.getpid(), signal.SIGINT)
        th = threading.Thread(target=fire)
        th.start()
        try:
            call()
            result = "finished"
        except KeyboardInterrupt:
            result = "KeyboardInterrupt"
        stopped = time.perf_counter()
        th.join()
        out[name] = {"result": result, "latency_s": stopped - sent.get("t", stopped)}
    after = model.run(small, capture=("logits",)).logits
    out["same_after"] = bool(np.array_equal(before, after))
    print(json.dumps(out))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_long_calls_stop_within_a_second_of_sigint(smollm2_gguf, tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), str(smollm2_gguf)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res.pop("same_after"), "the model gives other numbers after an interrupted call"
    for name, x in res.items():
        assert x["result"] == "KeyboardInterrupt", f"{name}: {x}"
        assert x["latency_s"] < 1.0, f"{name}: stopped {x['latency_s']:.2f} s after SIGINT"


GAPS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import sinklab as sl
    from sinklab import _core

    model = sl.load(sys.argv[1], quiet=True)
    d, L = model.config.d_model, model.config.n_layers
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, 2100)
    calls = {
        "forward + logits T=2100": lambda: model.run(ids, capture=("logits", "stats")),
        "loss_and_grad T=2100": lambda: model.loss_and_grad(ids),
        "vjp T=2100": lambda: model.vjp(ids, np.ones((2100, d), np.float32), at=L),
        "jvp T=2100": lambda: model.jvp(ids, np.ones((2100, d), np.float32), at=0),
        "jacobian T=256": lambda: model.jacobian(ids[:256], of=(L, 255), progress=False),
    }
    out = {}
    for name, call in calls.items():
        call()
        out[name] = _core._interrupt_check_gaps()
    print(json.dumps(out))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_no_stretch_of_a_long_call_goes_a_second_without_a_check(smollm2_gguf, tmp_path):
    """Whenever Ctrl-C lands, the call stops at the next check: the core times the stretches
    between its checks (and from the last one to the return) in each guarded call. In calls long
    enough to use every chunked product (T > 2048: the output head's row chunks, the weight
    gradients' K blocks and row chunks of sgemm_long_k), none lasts 1 s, and there are many checks."""
    script = tmp_path / "gaps.py"
    script.write_text(GAPS)
    r = subprocess.run([sys.executable, str(script), str(smollm2_gguf)], capture_output=True, text=True,
                       timeout=900, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for name, (checks, longest) in res.items():
        assert checks >= 30, f"{name}: only {checks} Ctrl-C checks"
        assert longest < 1.0, f"{name}: {longest:.2f} s without a Ctrl-C check"


def test_a_thread_other_than_the_main_one_is_not_interrupted(smollm2_gguf):
    """SIGINT concerns the main thread: a call in another thread finishes normally (and the main
    thread gets the KeyboardInterrupt, as Python does)."""
    code = textwrap.dedent("""
        import os, signal, sys, threading, time
        import numpy as np
        import sinklab as sl
        model = sl.load(sys.argv[1], quiet=True)
        ids = np.random.default_rng(1).integers(0, model.config.vocab_size, 2048)
        want = model.run(ids, capture=("logits",), logits_from=2047).logits.copy()
        got = {}
        def work():
            got["logits"] = model.run(ids, capture=("logits",), logits_from=2047).logits.copy()
        th = threading.Thread(target=work)
        th.start()
        time.sleep(0.3)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            main = "no interrupt"
        except KeyboardInterrupt:
            main = "KeyboardInterrupt"
        th.join()
        print(main, bool(np.array_equal(got["logits"], want)))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(smollm2_gguf)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["KeyboardInterrupt", "True"]
