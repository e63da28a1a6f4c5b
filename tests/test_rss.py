"""Resident memory stays flat (±1% after a warm-up) over repeated C-core calls and repeated failed
loads: a per-call leak in the extension or the loader would grow it without bound. The long
version (1,000 iterations on SmolLM2) is benchmarks/memcheck.py rss; valgrind's per-allocation
check is benchmarks/memcheck.py valgrind. Calls stopped by Ctrl-C free their memory too (the
long version, T=8192 and 20 interrupts: benchmarks/bench_interrupt.py).

Sensitivity: each forward below returns ~0.4 MB of captures (attention of every layer, residual
stream, logits); leaking them on every call would add ~70 MB over the measured iterations, far
above 1% of this process's RSS.
"""
import gc
import sys

import numpy as np
import pytest

import sinklab
from sinklab.train import AdamW, Trainer, llama_config

from tests.support.interrupt_rss import interrupted_rss  # the long version's runner (benchmarks/bench_interrupt.py)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

TOLERANCE = 0.01


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS")


def flat(step, iters: int = 200, warmup: int = 40):
    """(RSS after warm-up, RSS at the end) over iters calls of step()."""
    for _ in range(warmup):
        step()
    gc.collect()
    warm = rss_bytes()
    for _ in range(iters - warmup):
        step()
    gc.collect()
    return warm, rss_bytes()


def test_rss_flat_over_repeated_forward_vjp_and_training_step():
    cfg = llama_config(vocab_size=384, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, context_length=96)
    tr = Trainer(cfg, seed=0, init_std=0.08, optimizer=AdamW(weight_decay=0.1, grad_clip=1.0))
    m = tr.model
    rng = np.random.default_rng(0)
    T = 96
    ids = rng.integers(0, cfg.vocab_size, size=T).astype(np.int64)
    batch = rng.integers(0, cfg.vocab_size, size=(2, T + 1)).astype(np.int64)
    cot = rng.standard_normal((1, cfg.d_model)).astype(np.float32)
    expected_bytes = 4 * (2 * 4 * T * T + 3 * T * cfg.d_model + T * cfg.vocab_size)

    def step():
        out = m.run(ids, capture=("attn", "resid", "logits"))
        assert out.attn.nbytes + out.resid.nbytes + out.logits.nbytes >= expected_bytes
        m.vjp(ids, cot, at=(1, [T - 1]))
        tr.step(batch[:, :-1], batch[:, 1:], lr=1e-4)

    warm, end = flat(step)
    # the leak this would catch is larger than the tolerance (module docstring)
    assert 160 * expected_bytes > TOLERANCE * warm
    assert abs(end - warm) <= TOLERANCE * warm, f"RSS {warm / 2**20:.1f} -> {end / 2**20:.1f} MiB"


def test_rss_flat_over_repeated_failed_loads(smollm2_gguf, tmp_path):
    # truncated inside the metadata (the tokenizer's token list): header parsing, then the error
    bad = tmp_path / "truncated.gguf"
    with open(smollm2_gguf, "rb") as f:
        bad.write_bytes(f.read(64 << 10))

    def step():
        with pytest.raises(ValueError, match="truncated"):
            sinklab.load(bad, quiet=True)

    warm, end = flat(step)
    assert abs(end - warm) <= TOLERANCE * warm, f"RSS {warm / 2**20:.1f} -> {end / 2**20:.1f} MiB"


def test_rss_flat_over_interrupted_forward_and_loss_and_grad(smollm2_gguf):
    """An interrupted call unwinds through its error path and frees what it allocated: RSS
    after 6 rounds of (forward, loss_and_grad) stopped by Ctrl-C stays within 1% of RSS after
    the first round. Sensitivity: a loss_and_grad that kept its weight gradients (135 M floats,
    540 MB) would grow RSS by far more than 1% a round, and one that kept its activations
    (~1.5 MB at T=64) by ~15 MB over the 10 later calls, against 1% = ~1.7 MB of the ~170 MB
    held (a kept 1.6 MB array per call was caught)."""
    res = interrupted_rss(smollm2_gguf, 64, 6)
    # most calls were stopped, not run to the end (on a loaded machine a call may beat its timer)
    assert res["hits"] >= res["calls"] // 2, res
    first, end = res["rss"][0], res["rss"][-1]
    assert abs(end - first) <= TOLERANCE * first, f"RSS {first / 2**20:.1f} -> {end / 2**20:.1f} MiB: {res}"
