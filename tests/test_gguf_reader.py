"""sinklab's fast GGUF header reader vs the reference reader (`gguf.GGUFReader`), and its
errors on truncated, corrupted and hostile files."""
import os
import struct

import numpy as np
import pytest

from tests.support import reference_models as rm

gguf = rm.require("gguf")

from sinklab.io import registry  # noqa: E402
from sinklab.io.gguf_reader import GGUFFile, GGUFFormatError  # noqa: E402


def _write_small(path, n_vocab=50):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool("some.flag", True)
    w.add_string("general.name", "tiny ü")
    w.add_token_list([f"tok{i}" for i in range(n_vocab)])
    w.add_token_scores([float(-i) for i in range(n_vocab)])
    w.add_array("some.ints", [1, -2, 3])
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("b.weight", rng.standard_normal((5,)).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _assert_same_as_reference(path):
    ours, ref = GGUFFile(str(path)), gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert sorted(keys) == sorted(ours.fields)
    for k in keys:
        want, got = ref.fields[k].contents(), ours.fields[k]
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(np.asarray(want), got, err_msg=k)
        else:
            assert want == got, k
    assert [t.name for t in ref.tensors] == [t.name for t in ours.tensors]
    for a, b in zip(ref.tensors, ours.tensors):
        assert int(a.tensor_type) == b.type
        assert tuple(reversed([int(x) for x in a.shape])) == b.shape
        assert np.asarray(a.data).view(np.uint8).reshape(-1).tobytes() == b.data.tobytes()


def test_small_file_matches_reference(tmp_path):
    _assert_same_as_reference(_write_small(tmp_path / "s.gguf"))


@pytest.mark.real
def test_smollm2_matches_reference():
    path = registry.fetch("smollm2-135m-instruct", quiet=True)
    _assert_same_as_reference(path)


@pytest.mark.parametrize("cut", [3, 20, 60, 200, -28])
def test_truncated_file_raises(tmp_path, cut):
    src = _write_small(tmp_path / "s.gguf").read_bytes()
    bad = tmp_path / "t.gguf"
    bad.write_bytes(src[:cut] if cut > 0 else src[:cut])
    with pytest.raises(GGUFFormatError):
        GGUFFile(str(bad))


def test_hostile_lengths_raise(tmp_path):
    src = bytearray(_write_small(tmp_path / "s.gguf").read_bytes())
    # tensor count far beyond what the file can hold
    huge = bytearray(src)
    struct.pack_into("<Q", huge, 8, 1 << 60)
    (tmp_path / "h1.gguf").write_bytes(bytes(huge))
    with pytest.raises(GGUFFormatError, match="cannot fit"):
        GGUFFile(str(tmp_path / "h1.gguf"))
    # first key's length claims more bytes than exist
    huge = bytearray(src)
    struct.pack_into("<Q", huge, 24, 1 << 50)
    (tmp_path / "h2.gguf").write_bytes(bytes(huge))
    with pytest.raises(GGUFFormatError, match="truncated"):
        GGUFFile(str(tmp_path / "h2.gguf"))
    # not GGUF at all
    (tmp_path / "h3.gguf").write_bytes(b"GGML" + bytes(100))
    with pytest.raises(GGUFFormatError, match="magic"):
        GGUFFile(str(tmp_path / "h3.gguf"))


def test_tensor_past_end_raises(tmp_path):
    path = _write_small(tmp_path / "s.gguf")
    size = os.path.getsize(path)
    src = path.read_bytes()
    (tmp_path / "short.gguf").write_bytes(src[:size - 28])  # 6 bytes of the last tensor (then 22 of padding)
    with pytest.raises(GGUFFormatError, match="past the end"):
        GGUFFile(str(tmp_path / "short.gguf"))
