"""Requests larger than the machine: each call estimates what it needs before allocating and
raises a MemoryError that names the size, the memory available and a cheaper way to get the
answer, instead of being killed by the OOM killer (or failing with an empty MemoryError).

The model is tiny but has a 1M-token context, so that 300,000 tokens ask for terabytes (the
T x T attention of one layer alone is 4 heads x 300,000^2 x 4 bytes = 1.44 TB)."""
import os

import numpy as np
import pytest

import sinklab as sl

from tests.support.reference_models import TinySpec, make_hf_model, require, save_hf

T = 300_000
SPEC = TinySpec("mem-limits", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                vocab_size=300, context_length=1 << 20, seed=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    require("torch")
    return sl.load(str(save_hf(make_hf_model(SPEC), tmp_path_factory.mktemp("mem") / "m")))


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(0).integers(0, SPEC.vocab_size, T)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


CALLS = {
    "capture attn": (lambda m, ids: m.run(ids, capture=("attn",)), "capture=\"stats\""),
    "loss_and_grad": (lambda m, ids: m.loss_and_grad(ids), "fewer tokens"),
    "vjp": (lambda m, ids: m.vjp(ids, np.ones(64, np.float32), at=(2, T - 1)), "fewer"),
    "jvp": (lambda m, ids: m.jvp(ids, np.ones((T, 64), np.float32), at=0), "fewer tangents"),
    "jacobian block": (lambda m, ids: m.jacobian(ids, of=(2, T - 1), progress=False), "fewer"),
    "sensitivity map": (lambda m, ids: sl.sensitivity(m, ids, progress=False), "method='estimate'"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_request_larger_than_the_machine_is_refused_before_allocating(model, ids, name):
    call, cheaper = CALLS[name]
    before = _rss() if os.path.exists("/proc/self/status") else None
    with pytest.raises(MemoryError) as e:
        call(model, ids)
    msg = str(e.value)
    assert "GB" in msg and "available" in msg, msg                  # the size and what is there
    need = float(msg.split(" needs ")[1].split(" GB")[0])
    assert need > 1000, msg                                         # the estimate is a real one (TB)
    assert cheaper in msg, msg                                      # and the cheaper alternative
    if before is not None:
        assert _rss() - before < 200 << 20                          # nothing big was allocated first


def test_a_trainer_larger_than_the_machine_is_refused_with_its_size():
    from sinklab.train.engine import Trainer, llama_config

    with pytest.raises(MemoryError, match=r"206,361,870,336 parameters need 4127\.\d+ GB .* available; use a smaller"):
        Trainer(llama_config(vocab_size=4096, d_model=16384, n_layers=64, n_heads=128))
