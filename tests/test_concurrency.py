"""Several Python threads calling the C core at once (it releases the GIL around all work).

- Error messages are per call: threads that fail at the same time with different errors each
  get their own message (the core used to keep one process-wide buffer, and a few percent of
  the exceptions carried another thread's message).
- Thread counts: ``sl.set_num_threads(n)`` in one Python thread is what a call from any other
  Python thread uses (it used to set only the calling OS thread's OpenMP value, so a
  ``threading.Thread`` ran with the default), and ``with sl.threads(k):`` gives the calls of one
  Python thread their own count, so threads running at the same time use different counts.
- libgomp spins briefly before sleeping unless the user chose otherwise (OMP_WAIT_POLICY).
- Eight threads running forwards on one shared model give bitwise the results of running the
  same inputs one after the other; so do eight threads mixing forwards, Jacobian blocks, weight
  gradients and sink studies.
- A model cannot be freed under a running call: the call holds references to it, and the C
  handle holds references to every weight array it reads.
"""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.support import reference_models as rm

rm.require("torch")
rm.require("transformers")

import sinklab as sl  # noqa: E402
import sinklab._core as core  # noqa: E402

# small, so that a failing call costs microseconds and many calls overlap
ERR_SPEC = rm.TinySpec("conc-err", d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                       d_ff=128, vocab_size=300, context_length=64, seed=21)
# large enough that every kernel splits its work across threads
RUN_SPEC = rm.TinySpec("conc-run", d_model=256, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=32,
                       d_ff=704, vocab_size=1003, context_length=512, seed=22)
CALLS_PER_THREAD = 25_000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("conc")
    return {s.name: sl.load(str(rm.save_hf(rm.make_hf_model(s), root / s.name)))
            for s in (ERR_SPEC, RUN_SPEC)}


def _run_threads(targets):
    """Starts one thread per callable together, joins them, re-raises the first failure."""
    barrier = threading.Barrier(len(targets))
    results, errors = [None] * len(targets), []

    def wrap(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)

    ts = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(targets)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_concurrent_errors_keep_their_own_message(models):
    """Four threads fail 25,000 times each, with errors raised by the core with the GIL
    released (three: an out-of-vocabulary token id, each thread its own id and position) or
    by its size checks (one: a Q8_0 byte count of its own). Every exception must carry the
    message of the call that raised it."""
    handle = models[ERR_SPEC.name]._handle
    V = ERR_SPEC.vocab_size

    def failing(call, want):
        """A thread body: CALLS_PER_THREAD calls that must each raise ValueError with ``want``."""
        def work():
            wrong = []
            for _ in range(CALLS_PER_THREAD):
                try:
                    call()
                except ValueError as e:
                    if want not in str(e):
                        wrong.append(str(e))
                else:
                    wrong.append("no exception")
            return wrong
        return work

    def forward_errors(k):
        ids = np.zeros(8, np.int64)
        bad, pos = V + 17 * (k + 1), k + 2
        ids[pos] = bad
        return failing(lambda: core.model_forward(handle, ids),
                       f"token id {bad} at position {pos} is outside [0, {V})")

    raw = np.zeros(33, np.uint8)  # Q8_0: 32 elements take 34 bytes
    dequant_errors = failing(lambda: core.dequantize(8, raw, 32), "Q8_0 data has 33 bytes, expected 34")

    results = _run_threads([forward_errors(k) for k in range(3)] + [dequant_errors])
    n_wrong = sum(len(r) for r in results)
    sample = next((r[0] for r in results if r), "")
    assert n_wrong == 0, (f"{n_wrong} of {4 * CALLS_PER_THREAD} exceptions carried another call's "
                          f"message, e.g. {sample!r}")


def _in_new_thread(fn):
    return _run_threads([fn])[0]


def test_thread_count_is_process_wide(models, threads_restored):
    """set_num_threads in the main thread is what another Python thread's calls use: its
    get_num_threads, the team size of a parallel region opened as the kernels open theirs
    (core._team_size, a test-only helper), and its forward's results."""
    model = models[RUN_SPEC.name]
    ids = rm.random_ids(RUN_SPEC.vocab_size, 131, seed=1)
    default = sl.get_num_threads()
    serial = None
    for n in (1, default + 1, 2):  # default + 1 differs from any thread's OpenMP default
        sl.set_num_threads(n)
        assert sl.get_num_threads() == n
        got_n = _in_new_thread(sl.get_num_threads)
        assert got_n == n, f"set_num_threads({n}) in the main thread; another thread sees {got_n}"
        assert core._team_size() == n, "main thread"
        team, logits = _in_new_thread(lambda: (core._team_size(), model.run(ids, capture="logits").logits))
        assert team == n, f"set_num_threads({n}): a parallel region in another thread has {team} threads"
        if serial is None:
            serial = logits
        assert np.array_equal(logits, serial), f"{n} threads: logits differ from 1 thread"


def test_set_num_threads_rejects_bad_counts(threads_restored):
    for bad in (0, -1, 10**6):
        with pytest.raises(ValueError):
            sl.set_num_threads(bad)
        with pytest.raises(ValueError):
            with sl.threads(bad):
                pass


def test_threads_running_at_once_use_their_own_counts(models, threads_restored):
    """Eight threads, each inside ``sl.threads(k)`` with k = 1..4, open parallel regions at the
    same time (a barrier holds them all inside their blocks): each region has its own thread's
    k, the process-wide count set meanwhile does not change it, blocks nest and restore, and a
    thread outside any block has the process-wide count."""
    sl.set_num_threads(2)
    barrier = threading.Barrier(8)

    def worker(k):
        def run():
            seen = []
            with sl.threads(k):
                barrier.wait()
                seen.append((sl.get_num_threads(), core._team_size()))
                if k == 1:
                    sl.set_num_threads(3)  # process-wide, while the others are inside their blocks
                barrier.wait()
                seen.append(core._team_size())
                with sl.threads(k + 1):
                    seen.append(core._team_size())
                seen.append(core._team_size())
            return seen
        return run

    got = _run_threads([worker(1 + k % 4) for k in range(8)])
    for k, seen in enumerate(got):
        n = 1 + k % 4
        assert seen == [(n, n), n, n + 1, n], f"thread {k} in sl.threads({n}) saw {seen}"
    assert core._team_size() == 3 and _in_new_thread(core._team_size) == 3  # outside any block


def test_counts_per_call_give_the_same_bits(models, threads_restored):
    """Eight threads, each with its own count (1..4), run forwards and gradients at once: every
    result is bitwise the serial one-thread result."""
    model = models[RUN_SPEC.name]
    ids = [rm.random_ids(RUN_SPEC.vocab_size, 60 + 11 * k, seed=500 + k) for k in range(8)]

    def call(k):
        loss, grads = model.loss_and_grad(ids[k])
        return np.array(model.run(ids[k], capture="logits").logits, copy=True), loss, grads["lm_head"].copy()

    with sl.threads(1):
        serial = [call(k) for k in range(8)]

    def run(k):
        with sl.threads(1 + k % 4):
            return [call(k) for _ in range(2)]

    concurrent = _run_threads([lambda k=k: run(k) for k in range(8)])
    for k, reps in enumerate(concurrent):
        for logits, loss, g in reps:
            assert np.array_equal(logits, serial[k][0]) and loss == serial[k][1], f"thread {k} ({1 + k % 4} threads)"
            assert np.array_equal(g, serial[k][2]), f"thread {k}: lm_head gradient differs"


def test_eight_threads_share_a_model(models, threads_restored):
    """Eight threads, each with its own prompt, run forwards on one model at the same time;
    every result is bitwise the one a serial run gives for that prompt."""
    model = models[RUN_SPEC.name]
    sl.set_num_threads(2)
    prompts = [rm.random_ids(RUN_SPEC.vocab_size, 40 + 13 * k, seed=100 + k) for k in range(8)]
    capture = ("attn", "resid", "logits")

    def run(ids):
        tr = model.run(ids, capture=capture)
        return {c: np.array(getattr(tr, c), copy=True) for c in capture}

    serial = [run(ids) for ids in prompts]
    concurrent = _run_threads([lambda ids=ids: [run(ids) for _ in range(3)] for ids in prompts])
    for k, (want, got) in enumerate(zip(serial, concurrent)):
        for rep, g in enumerate(got):
            for c in capture:
                assert np.array_equal(g[c], want[c]), f"thread {k}, run {rep}: {c} differs from the serial run"


@pytest.mark.parametrize("user_value, want", [(None, "GOMP_SPINCOUNT = '3000'"),
                                               ("active", "OMP_WAIT_POLICY = 'ACTIVE'")])
def test_openmp_spins_briefly_unless_the_user_chose(user_value, want):
    """libgomp, as loaded by `import sinklab`, spins 3000 times (not its default 300000) before
    it sleeps, so that a team sharing a core with another process does not spin it away, unless
    the user chose a wait policy. Read back from libgomp itself (OMP_DISPLAY_ENV=VERBOSE prints
    what it parsed), not from os.environ."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if user_value is not None:
        env["OMP_WAIT_POLICY"] = user_value
    out = subprocess.run([sys.executable, "-c", "import sinklab"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in out.stderr:
        if not core.has_openmp:
            pytest.skip("built without OpenMP")
        pytest.skip("the OpenMP runtime is not libgomp (no OMP_DISPLAY_ENV output)")
    assert want in out.stderr, out.stderr


def test_eight_threads_mix_forwards_jacobians_gradients_and_sink_studies(models, threads_restored):
    """Eight threads share one model and run different kinds of call at once (forward with
    captures, an exact Jacobian block, the weight gradient, a sink study); each result is
    bitwise the one the same call gives alone."""
    model = models[RUN_SPEC.name]
    sl.set_num_threads(2)
    L = RUN_SPEC.n_layers
    ids = [rm.random_ids(RUN_SPEC.vocab_size, 24 + 7 * k, seed=300 + k) for k in range(8)]

    def forward(k):
        return np.array(model.run(ids[k], capture=("resid",)).resid, copy=True)

    def jacobian(k):
        return model.jacobian(ids[k], of=(L, len(ids[k]) - 1), wrt=0, progress=False)

    def gradient(k):
        loss, grads = model.loss_and_grad(ids[k])
        return np.float64(loss), {n: g.copy() for n, g in grads.items()}

    def sink_study(k):
        return sl.sink_study(model, [ids[k], ids[(k + 1) % 8]], T=16, progress=False).importance

    calls = [forward, jacobian, gradient, sink_study] * 2
    serial = [fn(k) for k, fn in enumerate(calls)]
    concurrent = _run_threads([lambda k=k, fn=fn: [fn(k) for _ in range(2)] for k, fn in enumerate(calls)])

    def same(a, b):
        if isinstance(a, tuple):
            return a[0] == b[0] and a[1].keys() == b[1].keys() and all(np.array_equal(a[1][n], b[1][n]) for n in a[1])
        return np.array_equal(a, b)

    for k, (want, got) in enumerate(zip(serial, concurrent)):
        for rep, g in enumerate(got):
            assert same(g, want), f"thread {k} ({calls[k].__name__}), run {rep}: differs from the call alone"


def test_a_model_dropped_while_another_thread_runs_it_stays_alive_until_the_call_ends(models, tmp_path):
    """Dropping the last reference to a Model while another thread is inside a C call on it
    cannot free the weights under that call: the running call holds its own references, the
    result is bitwise the undisturbed one, and the model is freed only once the call returns."""
    import gc
    import weakref

    path = str(rm.save_hf(rm.make_hf_model(RUN_SPEC), tmp_path / "m"))
    ids = rm.random_ids(RUN_SPEC.vocab_size, 400, seed=7)
    want = sl.load(path).run(ids, capture=("logits",)).logits.copy()
    model = sl.load(path)
    alive = weakref.ref(model)
    started, out = threading.Event(), {}

    def run(m):
        started.set()
        out["logits"] = [m.run(ids, capture=("logits",)).logits.copy() for _ in range(3)]

    t = threading.Thread(target=run, args=(model,))
    t.start()
    started.wait()
    del model
    gc.collect()
    t.join()
    assert all(np.array_equal(x, want) for x in out["logits"])
    del t, run
    out.clear()
    gc.collect()
    assert alive() is None, "the model outlived every reference to it"
    # the C handle alone keeps the weights it reads alive (it holds references to them)
    handle = sl.load(path)._handle
    gc.collect()
    logits = np.empty(want.shape, np.float32)
    core.model_forward(handle, np.ascontiguousarray(ids, np.int64), logits=logits)
    assert np.array_equal(logits, want)
