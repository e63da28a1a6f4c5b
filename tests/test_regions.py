"""The forward's fused parallel regions (issue 24, item 5) change no bit.

The C forward fuses, where nothing reads the intermediate tensor in between:
  - each residual add with the next block's pre-norm (sl_residual_rmsnorm / _layernorm), unless
    the block's output is captured (attn_out, mlp_out), a residual norm follows (BERT's post-LN),
    or a tape is recorded;
  - RoPE of q and k into the attention's own parallel region, unless q or k is captured;
  - in int8, the activations' quantization into the product's region.
Asking for attn_out, mlp_out, q and k therefore runs every layer in the unfused order (the order
before the change: separate add, norm and RoPE ops). These tests compare the two orders bitwise
on SmolLM2-135M at fp32, bf16 and int8 and on a tiny model of every family (LayerNorm, post-norms,
QK-norm, biases), and the fused forward bitwise across 1 and 2 threads at a length whose norms,
RoPE and products do split over 2 threads. Agreement with transformers is test_parity_*'s job
(those runs take the fused path: they capture neither attn_out, mlp_out, q nor k).
"""
import numpy as np
import pytest

from tests.support import reference_models as rm

rm.require("torch")
rm.require("transformers")

import sinklab as sl  # noqa: E402

FUSED = ("logits", "resid")
UNFUSED = FUSED + ("attn_out", "mlp_out", "q", "k")


def _run(model, ids, capture, **kw):
    if not model.config.has_lm_head:
        capture = tuple(c for c in capture if c != "logits")
    tr = model.run(ids, capture=capture, progress=False, **kw)
    return {k: np.array(getattr(tr, k), copy=True) for k in capture if k in FUSED}


def _assert_bitwise(a, b, what):
    for k in a:
        if not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)):
            n = int(np.count_nonzero(a[k] != b[k]))
            d = float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64))))
            pytest.fail(f"{what} {k}: not bitwise identical ({n} elements differ, max |diff| {d:.3e})")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_smollm2_fused_equals_unfused(smollm2_model, precision):
    # T = 100: every norm (T*d > 32768), the fused add+norm, RoPE and the products split over 2
    # threads; 2 threads vs 1 checks the fused regions' split.
    ids = rm.random_ids(49152, 100, seed=24)
    with sl.threads(2):
        fused = _run(smollm2_model, ids, FUSED, precision=precision)
        unfused = _run(smollm2_model, ids, UNFUSED, precision=precision)
    with sl.threads(1):
        fused1 = _run(smollm2_model, ids, FUSED, precision=precision)
    _assert_bitwise(fused, unfused, f"SmolLM2 {precision}: fused vs unfused order")
    _assert_bitwise(fused, fused1, f"SmolLM2 {precision}: fused, 2 vs 1 threads")


def test_smollm2_fused_equals_unfused_ragged_batch(smollm2_model):
    # packed rows of two sequences: RoPE rows in the attention's region take each row's position
    ids = rm.random_ids(49152, 90, seed=25, batch=2)
    lengths = np.array([90, 61], dtype=np.int64)
    with sl.threads(2):
        fused = _run(smollm2_model, ids, FUSED, lengths=lengths)
        unfused = _run(smollm2_model, ids, UNFUSED, lengths=lengths)
    _assert_bitwise(fused, unfused, "SmolLM2 ragged batch: fused vs unfused order")


def test_smollm2_fused_layer_selection(smollm2_model):
    # captures of some layers only: those layers unfused, the others fused, same bits
    ids = rm.random_ids(49152, 80, seed=26)
    with sl.threads(2):
        fused = _run(smollm2_model, ids, FUSED)
        mixed = _run(smollm2_model, ids, UNFUSED, layers=[0, 7, 29])
    _assert_bitwise(fused, mixed, "SmolLM2 layers=[0, 7, 29]: fused vs partly unfused")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return rm.FamilyModels(tmp_path_factory.mktemp("regions_families"))


@pytest.mark.parametrize("name", list(rm.FAMILY_SPECS))
def test_families_fused_equals_unfused(store, name):
    model = store.sl(name, "st")
    spec = rm.FAMILY_SPECS[name]
    ids = rm.random_ids(spec.hf["vocab_size"], spec.T, seed=27 + spec.seed)
    with sl.threads(2):
        fused = _run(model, ids, FUSED)
        unfused = _run(model, ids, UNFUSED)
    with sl.threads(1):
        fused1 = _run(model, ids, FUSED)
    _assert_bitwise(fused, unfused, f"{name}: fused vs unfused order")
    _assert_bitwise(fused, fused1, f"{name}: fused, 2 vs 1 threads")


@pytest.mark.parametrize("precision", [0, 1, 2], ids=["fp32", "bf16", "int8"])
@pytest.mark.parametrize("M", [5, 70])
def test_products_of_one_input_equal_separate_calls(precision, M):
    # q/k/v and gate/up run as one call (one parallel region; bf16/int8 round or quantize the
    # input once): each product bitwise its own call, on 1 and 2 threads, for widths that are not
    # multiples of a panel (200)
    from sinklab import _core as core

    rng = np.random.default_rng(40 + precision)
    a = rng.standard_normal((M, 576)).astype(np.float32)
    ws = [(0.05 * rng.standard_normal((n, 576))).astype(np.float32) for n in (576, 192, 200)]
    for threads in (1, 2):
        with sl.threads(threads):
            got = core._linear_shared(a, ws, precision)
            for w, y in zip(ws, got):
                if precision == 0:
                    ref = core.sgemm_nt(a, w)
                elif precision == 1:
                    ref = core._bf16_linear(a, w)
                else:
                    ref = core._linear_int8(a, w.view(np.uint8).ravel(), 0, w.shape[0], w.shape[1])
                _assert_bitwise({"y": y}, {"y": ref}, f"precision {precision}, M {M}, N {w.shape[0]}, "
                                                      f"{threads} threads: shared vs separate")
    with pytest.raises(ValueError):
        core._linear_shared(a, [ws[0], ws[1][:, :544].copy()], precision)  # K differs
