"""The int8 forward (precision="int8") against independent references.

The kernel itself is checked bit for bit in tests/test_int8_gemm.py. Here, the whole forward:

- a product inside the forward against NumPy: transformers' fp32 input to layer 0's v_proj,
  fake-quantized by a NumPy copy of the quantizer documented in csrc/gemm_int8.h (blocks of 32
  along each row, d = amax / 127 in float32, q = round-half-even(x * (127 / amax))), times the
  dequantized weight (SmolLM2's Q4_1 / Q8_0 matrices are used as int8 exactly). A whole-model
  fake-quantized transformers is no tighter reference: a one-ulp difference upstream moves a
  value across a quantization step now and then, and by layer 3 the two int8 forwards differ as
  much as int8 differs from fp32 (measured: 1e-2 relative), so later layers are compared with
  fp32 within a measured bound instead;
- the usual properties: thread count and batching change no bit, fp32 is untouched by int8 runs,
  the panels are counted, a model whose matrices the int8 kernel cannot take (widths not a
  multiple of 32) runs them in fp32, bit for bit.
"""
import numpy as np
import pytest

import sinklab as sl

pytestmark = pytest.mark.real


def fake_quant_rows(x: np.ndarray) -> np.ndarray:
    """x (..., K) float32 -> the dequantized int8 blocks q * d, float32 (the documented quantizer)."""
    x = np.asarray(x, np.float32)
    K = x.shape[-1]
    assert K % 32 == 0
    b = x.reshape(-1, K // 32, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (amax / np.float32(127)).astype(np.float32)
        inv = (np.float32(127) / amax).astype(np.float32)
        q = np.rint(np.clip(b * inv, -127, 127))          # np.rint: ties to even
    tiny = amax < np.float32(2.0 ** -100)
    q = np.where(tiny, 0.0, q)
    d = np.where(tiny, np.float32(0), d)
    return (q.astype(np.float64) * d).astype(np.float32).reshape(x.shape)


def _rel(x, ref):
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / np.linalg.norm(ref))


def test_smollm2_weights_are_used_exactly(smollm2_model):
    """The premise of the reference below: every SmolLM2 matrix is in a format int8 uses exactly."""
    from sinklab import _core
    from sinklab.families.tensors import QuantizedTensor

    types = {v.type for v in smollm2_model.weights.values() if isinstance(v, QuantizedTensor)}
    exact = (2, 3, 6, 7, 8, 12, 13)   # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K (csrc/gemm_int8.h)
    assert types and types <= set(exact), types
    assert _core._int8_info()["kernel"]


@pytest.mark.parametrize("prompt", ["chat", "paragraph", "long_mixed"])
def test_layer0_value_rows_are_the_int8_arithmetic(smollm2_model, smollm2_reference, prompt):
    """Layer 0's value projection inside the int8 forward against NumPy: transformers' fp32 input
    to v_proj (the normed embeddings), fake-quantized, times the dequantized weight in float64.
    The two inputs agree only to fp32 rounding (~1e-7), and one ulp can move a value across a
    quantization step (one int8 level of one block: ~0.3 % of a row), so the test asks that most
    rows agree to the summation order (<= 1e-5) and every row to a few steps (<= 2 %). Measured
    (2026-12-02): 88-91 % of the rows within 1e-5, the worst 0.76 % off."""
    import torch
    from tests.test_parity_smollm2 import PROMPTS, _hf_ids

    ref, tok = smollm2_reference
    ids = _hf_ids(tok, PROMPTS[prompt], True)
    seen = {}

    def keep_input(mod, args):   # returns None: the input goes on unchanged
        seen["x"] = args[0][0].detach().numpy().copy()

    h = ref.model.layers[0].self_attn.v_proj.register_forward_pre_hook(keep_input)
    try:
        with torch.no_grad():
            ref(torch.from_numpy(ids)[None])
    finally:
        h.remove()
    W = np.asarray(smollm2_model.weights["blk.0.attn_v"], np.float64)
    want = fake_quant_rows(seen["x"]).astype(np.float64) @ W.T                 # (T, G*hd)
    tr = smollm2_model.run(ids, capture="v", precision="int8")
    T = len(ids)
    got = tr.v[0].transpose(1, 0, 2).reshape(T, -1)
    rows = np.array([_rel(got[i], want[i]) for i in range(T)])
    fp32 = smollm2_model.run(ids, capture="v").v[0].transpose(1, 0, 2).reshape(T, -1)
    print(f"{prompt} T={T}: rows within 1e-5: {(rows <= 1e-5).mean():.2f}, worst {rows.max():.2e}; "
          f"int8 vs fp32 {_rel(got, fp32.astype(np.float64)):.2e}")
    assert (rows <= 1e-5).mean() >= 0.8 and rows.max() <= 0.02
    assert _rel(got, fp32.astype(np.float64)) > 1e-3    # the int8 path, not fp32 by mistake


# Measured (AMD EPYC, 2026-12-02) on the six parity prompts with BOS (T = 14-191): int8 logits
# relative error against transformers' fp32 0.015 - 0.038 (sinklab fp32: < 1e-6). Bound: 1.6x
# the largest measured.
INT8_LOGITS_REL_BOUND = 0.06


@pytest.mark.parametrize("prompt", ["short", "chat", "code", "paragraph", "long_mixed", "repetitive"])
def test_int8_logits_against_transformers_fp32(smollm2_model, smollm2_reference, prompt):
    import torch
    from tests.test_parity_smollm2 import PROMPTS, _hf_ids

    ref, tok = smollm2_reference
    ids = _hf_ids(tok, PROMPTS[prompt], True)
    with torch.no_grad():
        lg32 = ref(torch.from_numpy(ids)[None]).logits[0].double().numpy()
    ours = smollm2_model.run(ids, capture="logits", precision="int8")
    assert ours.meta["precision"] == "int8"
    r = _rel(ours.logits, lg32)
    print(f"{prompt} T={len(ids)}: int8 logits vs transformers fp32 {r:.3e}")
    assert 1e-3 < r <= INT8_LOGITS_REL_BOUND


def test_int8_deterministic_across_threads_and_batching(smollm2_model):
    m = smollm2_model
    rng = np.random.default_rng(3)
    ids = rng.integers(0, m.config.vocab_size, (3, 40))
    with sl.threads(2):
        two = m.run(ids, capture=("attn", "logits"), precision="int8")
    with sl.threads(1):
        one = m.run(ids, capture=("attn", "logits"), precision="int8")
        alone = m.run(ids[1], capture=("attn", "logits"), precision="int8")
    for k in ("attn", "logits"):
        assert np.array_equal(getattr(two, k), getattr(one, k)), k
        assert np.array_equal(getattr(one, k)[1], getattr(alone, k)), k


def test_fp32_untouched_by_int8_runs_and_panels_counted(smollm2_gguf):
    m = sl.load(str(smollm2_gguf), quiet=True)
    ids = np.array([1, 504, 3458, 314, 260], np.int64)
    before = m.run(ids, capture="logits").logits.copy()
    assert m.packed_bytes == 0
    q = m.run(ids, capture="logits", precision="int8").logits
    c = m.config
    # at least one byte per weight of every matrix of the forward (q, k, v, o, gate, up, down, head)
    per_layer = (c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim) * c.d_model \
        + c.d_model * c.n_heads * c.head_dim + 3 * c.d_ff * c.d_model
    assert m.packed_bytes >= c.n_layers * per_layer + c.vocab_size * c.d_model
    assert not np.array_equal(q, before)
    assert np.array_equal(m.run(ids, capture="logits").logits, before)
    m8 = sl.load(str(smollm2_gguf), quiet=True, precision="int8")
    assert np.array_equal(m8.run(ids, capture="logits").logits, q)
    with pytest.raises(ValueError, match="fp32 only"):
        m8.loss_and_grad(ids)


def test_matrices_the_kernel_cannot_take_stay_fp32(tmp_path):
    """A tiny model whose widths are not multiples of 32: int8 leaves every matrix on the fp32
    product, so the forward is the fp32 one bit for bit."""
    from tests.support import reference_models as rm

    spec = rm.TinySpec("int8-odd", d_model=40, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=10, d_ff=72,
                       vocab_size=300)
    rm.save_hf(rm.make_hf_model(spec), tmp_path)
    m = sl.load(str(tmp_path), quiet=True)
    ids = np.arange(1, 20, dtype=np.int64)
    a = m.run(ids, capture=("resid", "logits"))
    b = m.run(ids, capture=("resid", "logits"), precision="int8")
    assert np.array_equal(a.resid, b.resid) and np.array_equal(a.logits, b.logits)
    assert m.packed_bytes == 0
