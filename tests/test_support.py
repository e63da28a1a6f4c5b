"""The shared test support itself (tests/support/): the byte-level alphabet the tests build
their tokenizers from, the tiers (markers) and the on-disk cache of HF references, which must
give exactly what transformers' GGUF loader gives."""
import numpy as np
import pytest

from tests.support import reference_models as rm


def test_bytes_to_unicode_is_gpt2s_byte_level_alphabet():
    """The tests' copy against tokenizers' ByteLevel (an independent implementation): the same
    256 characters, and every byte of UTF-8 text mapped to the same character."""
    pre_tokenizers = rm.require("tokenizers.pre_tokenizers")
    b2u = rm.bytes_to_unicode()
    assert sorted(b2u) == list(range(256))
    assert len(set(b2u.values())) == 256                      # reversible
    assert set(b2u.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert all(b2u[b] == chr(b) for b in range(ord("!"), ord("~") + 1))   # printable ASCII kept
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # 1- to 4-byte UTF-8 sequences: every byte value valid UTF-8 can hold (all but C0, C1, F5-FF)
    text = "".join(chr(c) for c in list(range(0, 0x800)) + list(range(0x800, 0x10000, 61))
                   + list(range(0x10000, 0x110000, 4099)) if not 0xD800 <= c < 0xE000)
    seen = set(text.encode("utf-8"))
    assert len(seen) == 256 - 13
    (got, _), = byte_level.pre_tokenize_str(text)
    assert got == "".join(b2u[b] for b in text.encode("utf-8"))


def test_markers_are_registered(pytestconfig):
    names = {m.split(":", 1)[0].strip() for m in pytestconfig.getini("markers")}
    assert {"slow", "real", "cdriver", "large"} <= names


def test_real_marker_follows_the_fixtures(request):
    """A test that asks for a real model is marked ``real`` (conftest.py), this one is not."""
    assert request.node.get_closest_marker("real") is None


def test_a_test_using_smollm2_is_marked_real(smollm2_gguf, request):
    assert request.node.get_closest_marker("real") is not None


@pytest.mark.slow
def test_cached_reference_equals_transformers_gguf_loader(smollm2_gguf):
    """The on-disk reference (the session's) has the same config and the same tensors, bit for
    bit, as a fresh dequantization by transformers, and the same forward."""
    torch = rm.require("torch")
    fresh = rm.hf_gguf_model(str(smollm2_gguf), use_cache=False)
    cached = rm.hf_gguf_model(str(smollm2_gguf))
    a, b = fresh.state_dict(), cached.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k
    ca, cb = fresh.config.to_dict(), cached.config.to_dict()
    differ = {k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)}
    assert differ <= {"quantization_config", "_name_or_path"}, differ
    ids = np.array([1, 504, 3575, 282, 4649, 314, 7042, 28, 284, 260], dtype=np.int64)
    fa, fb = rm.hf_forward(fresh, ids), rm.hf_forward(cached, ids)
    for k in fa:
        assert np.array_equal(fa[k], fb[k]), k
