"""Weights stay quantized in memory, and that changes no number.

On the registered GGUF models (SmolLM2-135M Q4_1/Q8_0; Gemma-3-270M and Qwen2.5-Coder-0.5B
Q4_K_M, i.e. Q4_K/Q5_0/Q6_K/Q8_0):

* every matrix is a :class:`QuantizedTensor` whose bytes are a view of the file's memory map
  (no copy, no decoding at load);
* the model run on those blocks (decoded inside the SGEMM's weight packing) gives captures —
  logits, residual stream, attention, streaming stats — bitwise equal to the same model built
  from float32 matrices that gguf-py (llama.cpp's reference Python, ``gguf.quants.dequantize``)
  decoded: "dequantize, then multiply", end to end, on one sequence of T=64 and on a ragged
  padded batch;
* the resident set after load stays near the file size (measured in a fresh subprocess so that
  other tests' allocations do not count), while the fp32-resident model of the same file takes
  about 4 bytes per weight (the control: the measurement sees the difference).
"""
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support.required import unavailable

gguf = rm.require("gguf")
psutil = rm.require("psutil")

import sinklab as sl  # noqa: E402
from sinklab.families.tensors import QuantizedTensor  # noqa: E402

# registered name -> the ggml types its matrices are stored in
MODELS = {
    "smollm2-135m-instruct": {"Q4_1", "Q8_0"},
    "gemma-3-270m": {"Q4_K", "Q5_0", "Q6_K", "Q8_0"},
    "qwen2.5-coder-0.5b-instruct": {"Q4_K", "Q5_0", "Q6_K", "Q8_0"},
}
CAPTURE = ("logits", "resid", "attn", "stats")
pytestmark = pytest.mark.real   # every test here runs the registered real models
T = 64
RAGGED = (64, 41, 17)   # lengths of a padded (3, 64) batch
# RSS beyond the file: interpreter and imports (~60 MB), the tokenizer (Gemma 3's 262k-token
# vocabulary alone ~100 MB), the float32 norms; measured +67 (SmolLM2), +139..172 (Gemma-3),
# +106 MB (Qwen 0.5B) with every page of the file resident
RSS_SLACK = 250e6


def _fetch(name):
    from sinklab.io import registry

    try:
        return registry.fetch(name, quiet=True)
    except Exception as e:  # offline, no index, checksum mismatch: a failure where CI requires it
        unavailable(f"{name} could not be fetched: {e}")


def _memory_mapped(a) -> bool:
    """True when array ``a`` is a view whose base chain (arrays' ``base``, memoryviews' ``obj``)
    ends in a memory map."""
    while a is not None:
        if isinstance(a, (mmap.mmap, np.memmap)):
            return True
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return False


def _gguf_f32(t: QuantizedTensor) -> np.ndarray:
    """A quantized matrix decoded by gguf-py (independent of sinklab's decoder)."""
    out = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType(t.type))
    return np.ascontiguousarray(out, dtype=np.float32).reshape(t.shape)


def _fp32_resident(m):
    """``m`` rebuilt from float32 matrices decoded by gguf-py (a tied head stays one array)."""
    done = {}
    weights = {}
    for k, v in m.weights.items():
        if k == "rope_inv_freq":
            continue  # the constructor derives it from the config (no llama3 factors in these files)
        if isinstance(v, QuantizedTensor):
            v = done.setdefault(id(v), _gguf_f32(v))
        weights[k] = v
    out = sl.Model(m.config, weights, m.tokenizer, m.source, m.rope_layout, name=m.name + "-f32")
    if "rope_inv_freq" in m.weights:
        np.testing.assert_array_equal(out.weights["rope_inv_freq"], m.weights["rope_inv_freq"])
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request):
    """(registered name, quantized-resident model, fp32-resident model)."""
    m = sl.load(str(_fetch(request.param)), quiet=True)
    return request.param, m, _fp32_resident(m)


def _ids(m, B=None, seed=0):
    shape = (T,) if B is None else (B, T)
    ids = np.random.default_rng(seed).integers(0, m.config.vocab_size, size=shape, dtype=np.int64)
    if m.config.bos_token_id is not None:
        ids[..., 0] = m.config.bos_token_id
    return ids


def _assert_bitwise(tq, tf):
    for k in ("logits", "resid", "attn"):
        a, b = getattr(tq, k), getattr(tf, k)
        assert a is not None and a.shape == b.shape, k
        assert np.isfinite(a).all(), f"{k} has non-finite values"
        if not np.array_equal(a, b):
            i = np.unravel_index(np.argmax(a != b), a.shape)
            pytest.fail(f"{k} differs at {i}: quantized {a[i]!r} vs dequantize-then-multiply {b[i]!r} "
                        f"({np.count_nonzero(a != b)} of {a.size} values)")
    for k in ("importance", "to_first", "entropy"):
        a, b = getattr(tq.stats, k), getattr(tf.stats, k)
        assert np.isfinite(a).all() and np.array_equal(a, b), f"stats.{k} differs"


def test_matrices_stay_quantized_and_mapped(pair):
    name, mq, mf = pair
    mats = {k: v for k, v in mq.weights.items() if k != "rope_inv_freq" and v.ndim == 2}
    assert mats and all(isinstance(v, QuantizedTensor) for v in mats.values()), \
        sorted(k for k, v in mats.items() if not isinstance(v, QuantizedTensor))
    assert {v.type_name for v in mats.values()} == MODELS[name]
    unmapped = [k for k, v in mats.items() if v.data.flags.owndata or not _memory_mapped(v.data)]
    assert not unmapped, f"matrices copied out of the memory map: {unmapped[:5]}"
    # the reference really is float32 (the comparison below is not quantized against itself)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in mf.weights.values())


def test_bitwise_equal_to_dequantize_then_multiply(pair):
    _, mq, mf = pair
    ids = _ids(mq)
    _assert_bitwise(mq.run(ids, capture=CAPTURE, progress=False), mf.run(ids, capture=CAPTURE, progress=False))


def test_bitwise_equal_ragged_batch(pair):
    _, mq, mf = pair
    ids, lengths = _ids(mq, B=len(RAGGED), seed=1), np.array(RAGGED)
    tq = mq.run(ids, capture=CAPTURE, lengths=lengths, progress=False)
    tf = mf.run(ids, capture=CAPTURE, lengths=lengths, progress=False)
    _assert_bitwise(tq, tf)
    # and each padded sequence is what it gives alone (the batch is not a different computation)
    b = len(RAGGED) - 1
    alone = mq.run(ids[b, :RAGGED[b]], capture=("logits",), progress=False)
    np.testing.assert_array_equal(tq.logits[b, :RAGGED[b]], alone.logits)


# ----------------------------------------------------------------------------- resident memory
CHILD = r"""
import gc, json, sys, numpy as np, psutil
import sinklab as sl
from sinklab.families.tensors import QuantizedTensor
path, resident = sys.argv[1], sys.argv[2]
m = sl.load(path, quiet=True)
if resident == "f32":
    done = {}  # a tied head stays one array
    w = {k: done.setdefault(id(v), m.weight(k)) if id(v) not in done else done[id(v)]
         for k, v in m.weights.items() if k != "rope_inv_freq"}
    m = sl.Model(m.config, w, m.tokenizer, m.source, m.rope_layout)
gc.collect()
load = psutil.Process().memory_info()  # shared = file-backed resident pages (the map) on Linux
ids = np.arange(64) % m.config.vocab_size
m.run(ids, capture=("stats",), progress=False)
run = psutil.Process().memory_info()
print(json.dumps({"rss_load": load.rss, "anon_load": load.rss - load.shared, "rss_run": run.rss,
                  "n_weights": sum(int(np.prod(v.shape)) for v in {id(v): v for k, v in m.weights.items()
                                                    if k != "rope_inv_freq"}.values())}))  # a tied head once
"""


def _rss(path, resident):
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), resident], capture_output=True, text=True,
                       env=dict(os.environ, SINKLAB_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a subprocess per model measures its RSS
@pytest.mark.parametrize("name", list(MODELS))
def test_resident_memory_near_file_size(name):
    path = Path(_fetch(name))
    size = path.stat().st_size
    got = _rss(path, "quantized")
    print(f"\n{name}: file {size / 1e6:.1f} MB, RSS after load {got['rss_load'] / 1e6:.1f} MB "
          f"(anonymous {got['anon_load'] / 1e6:.1f} MB), after a T=64 stats run {got['rss_run'] / 1e6:.1f} MB")
    assert got["rss_load"] < size + RSS_SLACK
    # mapped pages count once the forward has read them: still the file plus small change
    assert got["rss_run"] < size + RSS_SLACK


@pytest.mark.slow  # a subprocess measures its RSS
def test_fp32_resident_memory_is_four_bytes_per_weight():
    """The control: the same measurement sees the fp32 path's 4 bytes per weight."""
    path = Path(_fetch("smollm2-135m-instruct"))
    q, f = _rss(path, "quantized"), _rss(path, "f32")
    print(f"\nSmolLM2 RSS after load: quantized {q['rss_load'] / 1e6:.1f} MB (anonymous {q['anon_load'] / 1e6:.1f}), "
          f"fp32-resident {f['rss_load'] / 1e6:.1f} MB (anonymous {f['anon_load'] / 1e6:.1f}; "
          f"{4 * f['n_weights'] / 1e6:.1f} MB of float32 weights)")
    assert f["anon_load"] - q["anon_load"] > 0.8 * 4 * f["n_weights"]
    assert f["rss_load"] > path.stat().st_size + RSS_SLACK  # the bound above would catch expanded weights
