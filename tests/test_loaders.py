"""Loading: config from both sources, and truncated, corrupted or incomplete files rejected
with an error that names the problem (never a crash or silent garbage)."""
import json
import shutil

import numpy as np
import pytest

import sinklab as sl
from sinklab.io.gguf_loader import GGUFError
from sinklab.io.hf_loader import SafetensorsError
from tests.support.reference_models import SPECS, make_hf_model, require, save_hf, write_gguf

gguf = require("gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("loaders")
    model = make_hf_model(SPECS["gqa_tied"])
    save_hf(model, d / "hf")
    write_gguf(model, d / "tiny.gguf", "F32")
    return d


def rewrite_gguf(src, dst, drop_keys=(), drop_tensors=(), replace_keys=None, reshape=None):
    """Copies a GGUF file through gguf's reader and writer, with edits."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), (replace_keys or {}).get("general.architecture", arch))
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in drop_keys or key == "general.architecture":
            continue
        val = (replace_keys or {}).get(key, f.contents())
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, val, f.types[0], sub)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if reshape and t.name in reshape:
            data = data.reshape(reshape[t.name])
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_configs_agree_between_sources(files):
    a, b = sl.load(files / "hf"), sl.load(files / "tiny.gguf")
    s = SPECS["gqa_tied"]
    for cfg in (a.config, b.config):
        assert (cfg.arch, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.head_dim, cfg.d_ff,
                cfg.vocab_size, cfg.context_length) == ("llama", s.n_layers, s.n_heads, s.n_kv_heads, s.d_model,
                                                         s.head_dim, s.d_ff, s.vocab_size, s.context_length)
        assert cfg.rope_theta == s.rope_theta and cfg.tied_embeddings and cfg.bos_token_id == 1
        assert cfg.norm_eps == pytest.approx(s.norm_eps)


def test_fp32_weights_are_not_copied(files):
    m = sl.load(files / "tiny.gguf")
    w = m.weights["blk.0.attn_q"]
    assert isinstance(w.base, np.memmap) or not w.flags.owndata  # a view into the memory map
    assert m.weights["lm_head"] is m.weights["tok_embd"]         # tied head shares the matrix


def test_bad_magic(files, tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + (files / "tiny.gguf").read_bytes()[4:])
    with pytest.raises(GGUFError, match="not a GGUF file"):
        sl.load(p)


@pytest.mark.parametrize("keep", [0.2, 0.6, 0.999])
def test_truncated_gguf(files, tmp_path, keep):
    data = (files / "tiny.gguf").read_bytes()
    p = tmp_path / "trunc.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GGUFError, match="corrupted or truncated|truncated or corrupted"):
        sl.load(p)


def test_garbage_header(files, tmp_path):
    data = bytearray((files / "tiny.gguf").read_bytes())
    data[8:24] = b"\xff" * 16  # tensor and kv counts become absurd
    p = tmp_path / "garbage.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError):
        sl.load(p)


def test_missing_tensor(files, tmp_path):
    p = rewrite_gguf(files / "tiny.gguf", tmp_path / "m.gguf", drop_tensors={"blk.1.ffn_up.weight"})
    with pytest.raises(GGUFError, match="blk.1.ffn_up.weight"):
        sl.load(p)


def test_shape_mismatch(files, tmp_path):
    s = SPECS["gqa_tied"]
    kv = s.n_kv_heads * s.head_dim
    p = rewrite_gguf(files / "tiny.gguf", tmp_path / "s.gguf", reshape={"blk.0.attn_k.weight": (s.d_model, kv)})
    with pytest.raises(GGUFError, match="blk.0.attn_k.weight has shape"):
        sl.load(p)


def test_missing_config_key(files, tmp_path):
    p = rewrite_gguf(files / "tiny.gguf", tmp_path / "k.gguf", drop_keys={"llama.block_count"})
    with pytest.raises(GGUFError, match="llama.block_count"):
        sl.load(p)


def test_unsupported_architecture(files, tmp_path):
    p = rewrite_gguf(files / "tiny.gguf", tmp_path / "a.gguf", replace_keys={"general.architecture": "mamba"})
    with pytest.raises(GGUFError, match="unsupported architecture 'mamba'"):
        sl.load(p)


def test_roundtrip_copy_still_loads(files, tmp_path):
    """The rewriting helper itself preserves a loadable file (so the failures above are the edits)."""
    p = rewrite_gguf(files / "tiny.gguf", tmp_path / "same.gguf")
    a = sl.load(p).run([1, 5, 9], capture=("logits",)).logits
    b = sl.load(files / "tiny.gguf").run([1, 5, 9], capture=("logits",)).logits
    assert np.array_equal(a, b)


def _copy_hf(files, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(files / "hf", d)
    return d


def test_hf_missing_config_key(files, tmp_path):
    d = _copy_hf(files, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match="hidden_size"):
        sl.load(d)


def test_hf_unsupported_architecture(files, tmp_path):
    d = _copy_hf(files, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt_neox'"):
        sl.load(d)


def test_hf_missing_tensor(files, tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy_hf(files, tmp_path)
    (st,) = [p for p in d.iterdir() if p.suffix == ".safetensors"]
    tensors = load_file(str(st))
    del tensors["model.layers.2.mlp.down_proj.weight"]
    save_file(tensors, str(st))
    with pytest.raises(KeyError, match="model.layers.2.mlp.down_proj.weight"):
        sl.load(d)


@pytest.mark.parametrize("keep", [4, 100, -8])
def test_hf_truncated_safetensors(files, tmp_path, keep):
    d = _copy_hf(files, tmp_path)
    (st,) = [p for p in d.iterdir() if p.suffix == ".safetensors"]
    data = st.read_bytes()
    st.write_bytes(data[:keep])
    with pytest.raises(SafetensorsError):
        sl.load(d)


def test_hf_offsets_past_end(files, tmp_path):
    d = _copy_hf(files, tmp_path)
    (st,) = [p for p in d.iterdir() if p.suffix == ".safetensors"]
    data = st.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = "model.norm.weight"
    lo, hi = header[name]["data_offsets"]
    header[name]["data_offsets"] = [lo + 10**9, hi + 10**9]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    st.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    with pytest.raises(SafetensorsError, match="model.norm.weight"):
        sl.load(d)


def test_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file"):
        sl.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        sl.load(tmp_path)


# ------------------------------------------------------------------ weights kept quantized
def test_quantized_matrices_stay_in_file_form(tmp_path):
    """A Q8_0 GGUF: matrices stay Q8_0 bytes inside the memory map (no fp32 copy at load),
    Model.weight decodes one exactly as gguf's reference decoder does, norms are float32."""
    from sinklab.families.tensors import QuantizedTensor

    spec = SPECS["mha"]
    assert spec.q8_ok
    p = write_gguf(make_hf_model(spec), tmp_path / "q8.gguf", "Q8_0")
    m = sl.load(p)
    q = m.weights["blk.0.attn_q"]
    assert isinstance(q, QuantizedTensor) and q.type_name == "Q8_0" and q.shape == (spec.n_heads * spec.head_dim, spec.d_model)
    base = q.data
    import mmap

    while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
        base = base.obj if isinstance(base, memoryview) else base.base
    assert isinstance(base, (np.memmap, mmap.mmap))                   # a view of the file, not a copy
    assert q.nbytes == q.shape[0] * q.shape[1] // 32 * 34              # 34 bytes per 32 values
    ref = gguf.quants.dequantize(np.asarray(q.data).reshape(q.shape[0], -1), gguf.GGMLQuantizationType.Q8_0)
    w = m.weight("blk.0.attn_q")
    assert w.dtype == np.float32 and np.array_equal(w, ref.reshape(q.shape))
    assert m.weights["blk.0.attn_norm"].dtype == np.float32
    assert m.weights["rope_inv_freq"].shape == (spec.n_layers, spec.head_dim // 2)
    assert "llama family" in repr(m) and "Q8_0" in repr(m)
    with pytest.raises(KeyError, match="blk.9.attn_q"):
        m.weight("blk.9.attn_q")


def test_model_without_lm_head_has_no_logits(tmp_path):
    """BERT: the default capture leaves logits out; asking for them names the reason."""
    transformers = require("transformers")
    require("torch")
    cfg = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40)
    transformers.BertModel(cfg).eval().save_pretrained(tmp_path / "bert", safe_serialization=True)
    m = sl.load(tmp_path / "bert")
    assert not m.has_lm_head and "bert family" in repr(m)
    tr = m.run([3, 7, 9, 11])
    assert tr.logits is None and tr.attn.shape == (2, 4, 4, 4) and tr.resid.shape == (3, 4, 32)
    for call in (lambda: m.run([3, 7], capture=("resid", "logits")), lambda: m.capture_bytes(4, "logits"),
                 lambda: m.loss_and_grad([3, 7, 9])):
        with pytest.raises(ValueError, match="no LM head"):
            call()
    with pytest.raises(ValueError, match="exceeds the model's context length 40"):
        m.run(np.zeros(41, np.int64))
