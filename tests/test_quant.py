"""Dequantisation of ggml block formats (csrc/quant.c) against gguf-py, the reference Python
implementation from llama.cpp (gguf.quants.dequantize / gguf.quants.quantize).

Comparisons are exact, bit for bit (float32 bit patterns equal), not within a tolerance: the C
decoders perform the same float32 operations in the same order as ggml's dequantize_row_* and
gguf-py (e.g. Q4_1: q*d + m; Q4_K: (d*sc)*q - dmin*m; Q6_K: (d*sc)*q), every operation is a
correctly rounded IEEE float32 operation in both, and the build does not contract a*b+c into an
FMA (-std=c11 implies -ffp-contract=off in GCC). fp16 -> fp32 is an exact widening (every half is
a float), so it cannot introduce a difference either. A 1-ulp tolerance would therefore only hide
a wrong operation order, which is the kind of bug these tests are for.

The raw blocks are random bytes with the fp16 scale fields (d, dmin/m) replaced by random *finite*
halves over the whole range (normals, subnormals, signed zeros, up to +-65504), so every bit of the
quant fields is exercised and the reference values are finite.
"""
import ctypes

import numpy as np
import pytest

import gguf  # a core dependency: its absence is a failure, not a skip
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from sinklab import _core  # noqa: E402

# type -> byte offsets of fp16 scale fields inside one block
SCALE_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
BLOCK_TYPES = list(SCALE_FIELDS)
PLAIN_TYPES = [T.F32, T.F16, T.BF16]
SUPPORTED = PLAIN_TYPES + BLOCK_TYPES


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bits_equal(got, ref):
    got = np.asarray(got).reshape(-1)
    ref = np.asarray(ref, dtype=np.float32).reshape(-1)
    assert got.dtype == np.float32 and got.shape == ref.shape
    bad = np.flatnonzero(bits(got) != bits(ref))
    if bad.size:
        i = bad[0]
        raise AssertionError(
            f"{bad.size} of {ref.size} values differ; first at {i}: got {got[i]!r} "
            f"(0x{bits(got)[i]:08x}), expected {ref[i]!r} (0x{bits(ref)[i]:08x})"
        )


def finite_halves(rng, n):
    """n random finite float16 bit patterns (any sign, exponent 0..30, any mantissa)."""
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    exp = (h >> 10) & 0x1F
    h = np.where(exp == 0x1F, h & np.uint16(0xBFFF), h)  # exponent 31 -> 15: finite
    return h.astype(np.uint16)


def random_blocks(rng, qtype, n_blocks, scale_lo=None):
    """Random raw blocks (n_blocks, block_bytes) uint8 with finite fp16 scale fields."""
    _, bb = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        if scale_lo is None:
            h = finite_halves(rng, n_blocks)
        else:  # "sane" magnitudes, as in real weights
            h = (rng.uniform(scale_lo, 2 * scale_lo, n_blocks) * rng.choice([-1, 1], n_blocks))
            h = h.astype(np.float16).view(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


def dequant(qtype, raw, n_elements):
    return _core.dequantize(int(qtype), np.ascontiguousarray(raw).reshape(-1), int(n_elements))


# ------------------------------------------------------------------------------ block sizes


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_block_size_matches_gguf(qtype):
    assert _core.quant_block_size(int(qtype)) == tuple(GGML_QUANT_SIZES[qtype])


@pytest.mark.parametrize("type_id", [16, 9, 10, 4, 31, 99, -1])
def test_block_size_unsupported(type_id):
    with pytest.raises(ValueError, match=str(type_id)):
        _core.quant_block_size(type_id)


# ------------------------------------------------------------------------------ random blocks


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_blocks", [1, 3, 1000])
def test_random_blocks_match_gguf(qtype, n_blocks):
    rng = np.random.default_rng(1000 * int(qtype) + n_blocks)
    be, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(rng, qtype, n_blocks)
    ref = gguf.quants.dequantize(raw, qtype)
    assert np.isfinite(ref).all()
    assert_bits_equal(dequant(qtype, raw, n_blocks * be), ref)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_random_blocks_sane_scales_match_gguf(qtype):
    rng = np.random.default_rng(7 + int(qtype))
    be, _ = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(rng, qtype, 257, scale_lo=1e-3)
    assert_bits_equal(dequant(qtype, raw, 257 * be), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_large_input_is_parallel_safe(qtype):
    """Many OpenMP chunks (and a ragged last one): still element-for-element equal."""
    rng = np.random.default_rng(99 + int(qtype))
    be, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = (300_000 // be) + 7
    raw = random_blocks(rng, qtype, n_blocks, scale_lo=1e-2)
    ref = gguf.quants.dequantize(raw, qtype)
    got = dequant(qtype, raw, n_blocks * be)
    assert_bits_equal(got, ref)
    assert_bits_equal(dequant(qtype, raw, n_blocks * be), got)  # repeatable


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_unaligned_source(qtype):
    """A tensor at an odd offset of a memory-mapped file: the source need not be aligned."""
    rng = np.random.default_rng(5)
    be, bb = GGML_QUANT_SIZES[qtype]
    raw = random_blocks(rng, qtype, 40)
    buf = np.zeros(raw.size + 3, dtype=np.uint8)
    buf[3:] = raw.reshape(-1)
    view = buf[3:]
    assert view.ctypes.data % 2 == 1
    assert_bits_equal(_core.dequantize(int(qtype), view, 40 * be), gguf.quants.dequantize(raw, qtype))


def test_q4_k_scale_unpacking_every_sub_block():
    """Distinct 6-bit scale/min per sub-block, so a get_scale_min_k4 slip shows up."""
    raw = np.zeros((1, 144), dtype=np.uint8)
    raw[0, 0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)
    raw[0, 2:4] = np.array([0.5], dtype=np.float16).view(np.uint8)
    sc = np.array([1, 2, 3, 4, 40, 50, 60, 63], dtype=np.uint8)
    mn = np.array([5, 6, 7, 8, 33, 45, 57, 62], dtype=np.uint8)
    s = np.zeros(12, dtype=np.uint8)
    s[0:4] = sc[:4] | ((sc[4:] >> 4) << 6)
    s[4:8] = mn[:4] | ((mn[4:] >> 4) << 6)
    s[8:12] = (sc[4:] & 0xF) | ((mn[4:] & 0xF) << 4)
    raw[0, 4:16] = s
    raw[0, 16:] = 0x21  # low nibble 1, high nibble 2
    got = dequant(T.Q4_K, raw, 256).reshape(8, 32)
    q = np.array([1, 2] * 4, dtype=np.float32)
    expect = (np.float32(1.0) * sc.astype(np.float32)) * q - np.float32(0.5) * mn.astype(np.float32)
    assert_bits_equal(got, np.repeat(expect[:, None], 32, axis=1))
    assert_bits_equal(got, gguf.quants.dequantize(raw, T.Q4_K))


# ------------------------------------------------------------------------------ plain types


def test_f16_every_bit_pattern():
    """All 65536 halves, incl. subnormals, +-0, +-inf and NaN payloads, bit-exact (as NumPy)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = h.view(np.float16).astype(np.float32)
    assert_bits_equal(_core.dequantize(int(T.F16), h.view(np.uint8), h.size), ref)
    assert_bits_equal(_core.dequantize(int(T.F16), h.view(np.uint8), h.size), gguf.quants.dequantize(h.view(np.uint8), T.F16))


def test_f16_specials():
    vals = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0xFC00],
                    dtype=np.uint16)
    got = _core.dequantize(int(T.F16), vals.view(np.uint8), vals.size)
    expect = np.array([0.0, -0.0, 2.0**-24, -(2.0**-24), 1023 * 2.0**-24, 2.0**-14, 1.0, 65504.0,
                       np.inf, -np.inf], dtype=np.float32)
    assert_bits_equal(got, expect)
    nan = _core.dequantize(int(T.F16), np.array([0x7E00, 0xFD01], dtype=np.uint16).view(np.uint8), 2)
    assert np.isnan(nan).all() and bits(nan)[0] == 0x7FC00000 and bits(nan)[1] == 0xFFA02000


def test_bf16_every_bit_pattern():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = gguf.quants.dequantize(h.view(np.uint8), T.BF16)
    assert_bits_equal(_core.dequantize(int(T.BF16), h.view(np.uint8), h.size), ref)
    assert_bits_equal(ref, (h.astype(np.uint32) << 16).view(np.float32))


def test_f32_is_a_bit_copy():
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, size=4 * 100_003, dtype=np.uint8)  # includes NaN patterns
    assert_bits_equal(_core.dequantize(int(T.F32), raw, 100_003), raw.view(np.float32))


# ------------------------------------------------------------------------------ every SIMD level
# sl_dequantize and the weight products decode through the level's decoders (AVX2 for the block
# types, AVX2/AVX-512 for F16 and BF16): each must match gguf bit for bit on its own.

LEVELS = {"generic": ["generic"], "avx2": ["generic", "avx2"],
          "avx512": ["generic", "avx2", "avx512"]}[_core.simd_best()]


@pytest.fixture(params=LEVELS)
def level(request):
    before = _core.simd()
    assert _core.set_simd(request.param) == request.param
    yield request.param
    _core.set_simd(before)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_every_level_matches_gguf(level, qtype):
    """Full-range finite scales and realistic ones, from an odd address."""
    rng = np.random.default_rng(31 + int(qtype))
    be, _ = GGML_QUANT_SIZES[qtype]
    for scale_lo in (None, 1e-3):
        raw = random_blocks(rng, qtype, 67, scale_lo=scale_lo)
        buf = np.zeros(raw.size + 1, dtype=np.uint8)
        buf[1:] = raw.reshape(-1)
        assert_bits_equal(_core.dequantize(int(qtype), buf[1:], 67 * be), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_every_level_every_half(level, qtype):
    """All 65536 patterns (signalling NaNs keep their quiet bit clear, as in NumPy: not F16C's
    conversion), at an odd address and with a tail shorter than a vector (65536 - 3 values)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for n in (h.size, h.size - 3):
        buf = np.zeros(2 * n + 1, dtype=np.uint8)
        buf[1:] = h[:n].view(np.uint8)
        ref = gguf.quants.dequantize(h[:n].view(np.uint8), qtype)
        assert_bits_equal(_core.dequantize(int(qtype), buf[1:], n), ref)


# ------------------------------------------------------------------------------ via quantize


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.F16],
                         ids=lambda t: t.name)
def test_roundtrip_from_gguf_quantize(qtype):
    """Second source of blocks: gguf.quants.quantize on random float data (realistic blocks)."""
    rng = np.random.default_rng(11 + int(qtype))
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 3.0, (64, 1))).astype(np.float32)
    q = np.ascontiguousarray(gguf.quants.quantize(x, qtype))
    raw = q.view(np.uint8).reshape(-1)
    ref = gguf.quants.dequantize(q, qtype).reshape(-1)
    got = _core.dequantize(int(qtype), raw, x.size)
    assert_bits_equal(got, ref)
    # and the decoded values are a quantisation of x: within one quantisation step of it
    be, _ = GGML_QUANT_SIZES[qtype]
    xb = x.reshape(-1, max(be, 1))
    span = (xb.max(axis=1, keepdims=True) - xb.min(axis=1, keepdims=True)) if be > 1 else np.abs(xb)
    step = {T.Q4_0: 1 / 7, T.Q4_1: 1 / 15, T.Q5_0: 1 / 15, T.Q5_1: 1 / 31, T.Q8_0: 1 / 127,
            T.BF16: 2.0**-7, T.F16: 2.0**-10}[qtype]
    err = np.abs(got.reshape(xb.shape) - xb)
    assert (err <= span * step + 1e-6).all()


# ------------------------------------------------------------------------------ errors


def test_wrong_byte_length():
    rng = np.random.default_rng(0)
    raw = random_blocks(rng, T.Q4_0, 4).reshape(-1)
    with pytest.raises(ValueError, match=r"Q4_0 data has 71 bytes, expected 72"):
        _core.dequantize(int(T.Q4_0), raw[:-1], 128)
    longer = np.concatenate([raw, np.zeros(1, np.uint8)])
    with pytest.raises(ValueError, match=r"73 bytes, expected 72"):
        _core.dequantize(int(T.Q4_0), longer, 128)
    with pytest.raises(ValueError, match=r"Q6_K data has 72 bytes, expected 210"):
        _core.dequantize(int(T.Q6_K), raw, 256)


@pytest.mark.parametrize("qtype,n", [(T.Q4_0, 33), (T.Q8_0, 16), (T.Q4_K, 32), (T.Q6_K, 255)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_n_elements_not_multiple_of_block(qtype, n):
    _, bb = GGML_QUANT_SIZES[qtype]
    with pytest.raises(ValueError, match=rf"n_elements {n} is not a multiple of the {qtype.name} block size"):
        _core.dequantize(int(qtype), np.zeros(bb, np.uint8), n)


@pytest.mark.parametrize("type_id,name", [(16, "IQ2_XXS"), (10, "Q2_K"), (9, "Q8_1"), (99, "unknown"),
                                          (-1, "unknown")])
def test_unsupported_type(type_id, name):
    with pytest.raises(ValueError, match=rf"unsupported ggml type id {type_id} \({name}"):
        _core.dequantize(type_id, np.zeros(66, np.uint8), 256)


def test_negative_n_elements():
    with pytest.raises(ValueError, match="n_elements"):
        _core.dequantize(int(T.Q8_0), np.zeros(34, np.uint8), -32)


def test_empty_is_fine():
    out = _core.dequantize(int(T.Q4_K), np.zeros(0, np.uint8), 0)
    assert out.shape == (0,) and out.dtype == np.float32


# ------------------------------------------------------------------------------ C entry directly
# Checks the binding cannot reach (NULL pointers, size overflow, the serial path). They call the
# exported C symbol in the extension through ctypes and are skipped where it is not exported.


@pytest.fixture(scope="module")
def c_dequantize():
    try:
        lib = ctypes.CDLL(_core.__file__)
        fn = lib.sl_dequantize
        err = lib.sl_last_error
    except (OSError, AttributeError):
        pytest.skip("sl_dequantize is not an exported symbol of sinklab._core")
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int]
    fn.restype = ctypes.c_int
    err.restype = ctypes.c_char_p
    return fn, err


def test_c_serial_equals_parallel(c_dequantize):
    fn, _ = c_dequantize
    rng = np.random.default_rng(2)
    for qtype in BLOCK_TYPES:
        be, _ = GGML_QUANT_SIZES[qtype]
        nb = 100_000 // be + 3
        raw = random_blocks(rng, qtype, nb, scale_lo=0.01).reshape(-1)
        outs = []
        for parallel in (0, 1):
            out = np.full(nb * be, np.nan, np.float32)
            assert fn(int(qtype), raw.ctypes.data, raw.size, out.ctypes.data, out.size, parallel) == 0
            outs.append(out)
        assert_bits_equal(outs[0], outs[1])
        assert_bits_equal(outs[0], gguf.quants.dequantize(raw.reshape(nb, -1), qtype))


def test_c_null_pointers_and_overflow(c_dequantize):
    fn, err = c_dequantize
    out = np.zeros(32, np.float32)
    raw = np.zeros(34, np.uint8)
    assert fn(int(T.Q8_0), None, 34, out.ctypes.data, 32, 1) != 0
    assert b"NULL" in err()
    assert fn(int(T.Q8_0), raw.ctypes.data, 34, None, 32, 1) != 0
    assert b"NULL" in err()
    # 2^62 F32 elements are 2^64 bytes: overflows int64 (quantised types have < 4 bytes/element)
    assert fn(int(T.F32), raw.ctypes.data, 34, out.ctypes.data, 1 << 62, 1) != 0
    assert b"overflow" in err()
    assert fn(int(T.Q8_0), raw.ctypes.data, -1, out.ctypes.data, 32, 1) != 0
    assert fn(int(T.Q8_0), raw.ctypes.data, 34, out.ctypes.data, 32, 0) == 0


# ------------------------------------------------------------------------------ real model


@pytest.fixture
def smol_path(request):
    try:
        return request.getfixturevalue("smollm2_gguf")
    except pytest.FixtureLookupError:
        pytest.skip("fixture smollm2_gguf (SmolLM2-135M-Instruct.Q4_1.gguf) not provided")


def test_real_smollm2_tensors(smol_path):
    reader = gguf.GGUFReader(str(smol_path))
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type, []).append(t)
    picks = [
        next(t for t in by_type[T.Q8_0] if t.name == "token_embd.weight"),
        next(t for t in by_type[T.Q4_1] if t.name.endswith("ffn_down.weight")),
        next(t for t in by_type[T.F32] if t.name.endswith("attn_norm.weight")),
    ]
    for t in picks:
        raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        assert raw.size == t.n_bytes
        got = _core.dequantize(int(t.tensor_type), raw, int(t.n_elements))
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert_bits_equal(got, ref)
        assert np.isfinite(got).all(), t.name
