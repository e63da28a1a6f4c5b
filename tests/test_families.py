"""Family modules: Hugging Face and GGUF files of every supported family map onto the canonical
tensors of the C contract, checked against independent references.

* HF: tiny random models built with `transformers`; the expected canonical tensors are written
  out here from the torch ``state_dict`` (one explicit mapping per family, e.g. Gemma's 1 + w,
  GPT-2's transposed and split ``c_attn``), every parameter must land somewhere, and the config
  read from config.json must agree with what the transformers modules compute (attention scale,
  sliding window per layer, RoPE inverse frequencies per layer).
* GGUF: files written here the way llama.cpp's converter writes each architecture (Gemma norms
  stored as 1 + w, GPT-2's fused ``attn_qkv``, BERT's ``token_types``), with Q8_0 / F16
  matrices; quantized matrices must stay quantized and decode exactly as ``gguf.quants``
  decodes them, and the config must equal the one read from the HF folder.
"""
import json
import math

import numpy as np
import pytest

from tests.support import reference_models as rm
from tests.support.reference_models import require

torch = require("torch")
transformers = require("transformers")
gguf = require("gguf")

import sinklab as sl  # noqa: E402
from sinklab import families  # noqa: E402
from sinklab.families import base  # noqa: E402
from sinklab.families.rope import layer_inv_freq  # noqa: E402
from sinklab.families.tensors import QuantizedTensor, to_f32  # noqa: E402
from sinklab.io import gguf_loader, hf_loader  # noqa: E402
from sinklab.io.gguf_loader import GGUFError  # noqa: E402

D, H, G, HD, F, V, L = 64, 4, 2, 16, 128, 320, 3
COMMON = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
              num_key_value_heads=G, head_dim=HD, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)


def _llama_like(kind):
    T = transformers
    if kind == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True))
    if kind == "mistral":
        return T.MistralForCausalLM(T.MistralConfig(**COMMON, sliding_window=5))
    if kind == "qwen2":
        return T.Qwen2ForCausalLM(T.Qwen2Config(**COMMON, tie_word_embeddings=True))
    if kind == "qwen3":
        return T.Qwen3ForCausalLM(T.Qwen3Config(**COMMON, tie_word_embeddings=False))
    if kind == "gemma":
        return T.GemmaForCausalLM(T.GemmaConfig(**COMMON))
    if kind == "gemma2":
        return T.Gemma2ForCausalLM(T.Gemma2Config(**COMMON, sliding_window=5, query_pre_attn_scalar=24,
                                                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0))
    if kind == "gemma3":
        c = dict(COMMON, num_hidden_layers=7)
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0}}
        return T.Gemma3ForCausalLM(T.Gemma3TextConfig(**c, sliding_window=5, query_pre_attn_scalar=16,
                                                      rope_parameters=rope))
    raise KeyError(kind)


def build(kind):
    """A random fp32 model of ``kind``; every parameter (norms too) drawn at random so that a
    swapped or missing tensor shows."""
    T = transformers
    torch.manual_seed(0)
    if kind == "gpt2":
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=96,
                                               bos_token_id=1, eos_token_id=2))
    elif kind == "bert":
        model = T.BertModel(T.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                         intermediate_size=F, max_position_embeddings=96))
    else:
        model = _llama_like(kind)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g) + (0.8 if p.ndim == 1 else 0.0))
    return model.eval()


KINDS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "bert")
IGNORED = ("pooler.",)  # BERT's pooler is not part of the stream


def expected_canonical(kind, model):
    """canonical name -> float32 array, from the state_dict, and the set of state_dict keys used."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    used = set()

    def t(name):
        used.add(name)
        return sd[name]

    E = {}
    if kind == "gpt2":
        E["tok_embd"], E["pos_embd"] = t("transformer.wte.weight"), t("transformer.wpe.weight")
        E["out_norm"], E["out_norm_b"] = t("transformer.ln_f.weight"), t("transformer.ln_f.bias")
        E["lm_head"] = t("lm_head.weight")
        for l in range(L):
            p = f"transformer.h.{l}."
            W, b = t(p + "attn.c_attn.weight"), t(p + "attn.c_attn.bias")   # Conv1D: (in, out)
            for i, n in enumerate("qkv"):
                E[f"blk.{l}.attn_{n}"] = W[:, i * D:(i + 1) * D].T
                E[f"blk.{l}.attn_{n}_b"] = b[i * D:(i + 1) * D]
            E[f"blk.{l}.attn_output"], E[f"blk.{l}.attn_output_b"] = t(p + "attn.c_proj.weight").T, t(p + "attn.c_proj.bias")
            E[f"blk.{l}.attn_norm"], E[f"blk.{l}.attn_norm_b"] = t(p + "ln_1.weight"), t(p + "ln_1.bias")
            E[f"blk.{l}.ffn_norm"], E[f"blk.{l}.ffn_norm_b"] = t(p + "ln_2.weight"), t(p + "ln_2.bias")
            E[f"blk.{l}.ffn_up"], E[f"blk.{l}.ffn_up_b"] = t(p + "mlp.c_fc.weight").T, t(p + "mlp.c_fc.bias")
            E[f"blk.{l}.ffn_down"], E[f"blk.{l}.ffn_down_b"] = t(p + "mlp.c_proj.weight").T, t(p + "mlp.c_proj.bias")
    elif kind == "bert":
        e = "embeddings."
        E["tok_embd"], E["pos_embd"] = t(e + "word_embeddings.weight"), t(e + "position_embeddings.weight")
        E["type_embd"] = t(e + "token_type_embeddings.weight")[0]
        E["embd_norm"], E["embd_norm_b"] = t(e + "LayerNorm.weight"), t(e + "LayerNorm.bias")
        for l in range(L):
            p = f"encoder.layer.{l}."
            for n, hf in (("q", "query"), ("k", "key"), ("v", "value")):
                E[f"blk.{l}.attn_{n}"], E[f"blk.{l}.attn_{n}_b"] = t(p + f"attention.self.{hf}.weight"), t(p + f"attention.self.{hf}.bias")
            E[f"blk.{l}.attn_output"], E[f"blk.{l}.attn_output_b"] = t(p + "attention.output.dense.weight"), t(p + "attention.output.dense.bias")
            E[f"blk.{l}.attn_res_norm"], E[f"blk.{l}.attn_res_norm_b"] = t(p + "attention.output.LayerNorm.weight"), t(p + "attention.output.LayerNorm.bias")
            E[f"blk.{l}.ffn_up"], E[f"blk.{l}.ffn_up_b"] = t(p + "intermediate.dense.weight"), t(p + "intermediate.dense.bias")
            E[f"blk.{l}.ffn_down"], E[f"blk.{l}.ffn_down_b"] = t(p + "output.dense.weight"), t(p + "output.dense.bias")
            E[f"blk.{l}.ffn_res_norm"], E[f"blk.{l}.ffn_res_norm_b"] = t(p + "output.LayerNorm.weight"), t(p + "output.LayerNorm.bias")
    else:
        gemma = kind.startswith("gemma")
        # Gemma's RMSNorm multiplies by (1 + w), computed in float32
        norm = (lambda w: np.float32(1) + w) if gemma else (lambda w: w)
        n_layers = model.config.num_hidden_layers
        E["tok_embd"], E["out_norm"], E["lm_head"] = t("model.embed_tokens.weight"), norm(t("model.norm.weight")), t("lm_head.weight")
        for l in range(n_layers):
            p, b = f"model.layers.{l}.", f"blk.{l}."
            E[b + "attn_norm"] = norm(t(p + "input_layernorm.weight"))
            for n, hf in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("output", "o_proj")):
                E[b + f"attn_{n}"] = t(p + f"self_attn.{hf}.weight")
                if p + f"self_attn.{hf}.bias" in sd:
                    E[b + f"attn_{n}_b"] = t(p + f"self_attn.{hf}.bias")
            for n in ("q", "k"):
                if p + f"self_attn.{n}_norm.weight" in sd:
                    E[b + f"attn_{n}_norm"] = norm(t(p + f"self_attn.{n}_norm.weight"))
            if kind in ("gemma2", "gemma3"):
                E[b + "attn_post_norm"] = norm(t(p + "post_attention_layernorm.weight"))
                E[b + "ffn_norm"] = norm(t(p + "pre_feedforward_layernorm.weight"))
                E[b + "ffn_post_norm"] = norm(t(p + "post_feedforward_layernorm.weight"))
            else:
                E[b + "ffn_norm"] = norm(t(p + "post_attention_layernorm.weight"))
            for n in ("gate", "up", "down"):
                E[b + f"ffn_{n}"] = t(p + f"mlp.{n}_proj.weight")
                if p + f"mlp.{n}_proj.bias" in sd:
                    E[b + f"ffn_{n}_b"] = t(p + f"mlp.{n}_proj.bias")
    unused = sorted(k for k in sd if k not in used and not k.startswith(IGNORED))
    return E, unused


def hf_reference_config(kind, model):
    """What the transformers modules compute: per-layer window, attention scale, RoPE inverse
    frequencies (L, hd/2) (None without RoPE)."""
    c = model.config
    n = c.num_hidden_layers
    if kind in ("gpt2", "bert"):
        scale = [1.0 / math.sqrt(D // H)] * n
        return dict(window=[0] * n, scale=scale, inv_freq=None)
    layers = model.model.layers
    types = getattr(c, "layer_types", None) or ["full_attention"] * n
    if kind == "mistral":
        window = [c.sliding_window or 0] * n
    else:
        window = [c.sliding_window if ty == "sliding_attention" and c.sliding_window else 0 for ty in types]
    rot = model.model.rotary_emb
    inv = []
    for l in range(n):
        buf = getattr(rot, f"{types[l]}_inv_freq", None)
        inv.append((buf if buf is not None else rot.inv_freq).float().numpy())
    return dict(window=window, scale=[float(layers[l].self_attn.scaling) for l in range(n)], inv_freq=np.stack(inv))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    out = {}
    for kind in KINDS:
        model = build(kind)
        model.save_pretrained(root / kind, safe_serialization=True)
        out[kind] = (model, root / kind)
    return out


def load_hf(path):
    cfg = hf_loader.read_config(str(path))
    return cfg, hf_loader.load_hf_weights(str(path), cfg)


def assert_canonical(got, expected):
    assert sorted(got) == sorted(expected)
    for k, ref in expected.items():
        g = got[k]
        assert isinstance(g, np.ndarray) and g.dtype == np.float32 and g.flags.c_contiguous, k
        assert g.shape == ref.shape, k
        assert np.array_equal(g, ref), k


@pytest.mark.parametrize("kind", KINDS)
def test_hf_tensors_match_state_dict(hf_dirs, kind):
    model, path = hf_dirs[kind]
    cfg, w = load_hf(path)
    E, unused = expected_canonical(kind, model)
    assert unused == [], f"parameters not read: {unused}"
    if cfg.tied_embeddings:
        assert w["lm_head"] is w["tok_embd"]
    assert_canonical(w, E)
    assert base.canonical_shapes(cfg) == {k: v.shape for k, v in E.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_hf_config_matches_transformers(hf_dirs, kind):
    model, path = hf_dirs[kind]
    cfg = hf_loader.read_config(str(path))
    ref = hf_reference_config(kind, model)
    c = model.config
    assert cfg.n_layers == c.num_hidden_layers and cfg.d_model == D and cfg.n_heads == H
    assert cfg.family == families.for_hf_type(c.model_type).NAME
    assert [cfg.layer_window(l) for l in range(cfg.n_layers)] == ref["window"]
    scale = cfg.core_config(0).get("attn_scale", 1.0 / math.sqrt(cfg.head_dim))
    assert all(math.isclose(scale, s, rel_tol=1e-12) for s in ref["scale"])
    if ref["inv_freq"] is None:
        assert cfg.positions == "learned" and cfg.n_pos == 96
    else:
        # HF computes them in float32 torch arithmetic, sinklab in float64 rounded once
        np.testing.assert_allclose(layer_inv_freq(cfg), ref["inv_freq"], rtol=2e-7)
    softcaps = (getattr(c, "attn_logit_softcapping", None) or 0.0, getattr(c, "final_logit_softcapping", None) or 0.0)
    assert (cfg.attn_softcap, cfg.final_softcap) == softcaps
    gemma = kind.startswith("gemma")
    assert cfg.embd_scale == (float(np.float32(math.sqrt(D))) if gemma else 1.0)
    assert cfg.act == {"gpt2": "gelu_tanh", "bert": "gelu"}.get(kind, "geglu_tanh" if gemma else "swiglu")
    assert cfg.norm_kind == ("layernorm" if kind in ("gpt2", "bert") else "rmsnorm")
    assert cfg.bidirectional == (kind == "bert") and cfg.has_lm_head == (kind != "bert")


def test_gemma3_local_and_global_rope(hf_dirs):
    """Gemma 3: sliding layers use base 10000 unscaled, full ones 1e6 with the linear factor."""
    cfg = hf_loader.read_config(str(hf_dirs["gemma3"][1]))
    inv = layer_inv_freq(cfg)
    assert cfg.window == (5, 5, 5, 5, 5, 0, 5)
    i = np.arange(0, HD, 2) / HD
    np.testing.assert_allclose(inv[0], 1 / 10000.0 ** i, rtol=1e-7)
    np.testing.assert_allclose(inv[5], 1 / 1e6 ** i / 4.0, rtol=1e-7)


def _resave(src, dst, rename, config_edit=None):
    from safetensors.numpy import load_file, save_file
    import shutil

    shutil.copytree(src, dst)
    (st,) = [p for p in dst.iterdir() if p.suffix == ".safetensors"]
    tensors = load_file(str(st))
    save_file({rename(k): v for k, v in tensors.items()}, str(st))
    if config_edit:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(config_edit(cfg)))
    return dst


def test_bert_with_prefix_and_gpt2_without(hf_dirs, tmp_path):
    """BertForX checkpoints carry a ``bert.`` prefix; a saved GPT2Model has no ``transformer.``."""
    model, path = hf_dirs["bert"]
    E, _ = expected_canonical("bert", model)
    _, w = load_hf(_resave(path, tmp_path / "bert", lambda k: "bert." + k))
    assert_canonical(w, E)
    model, path = hf_dirs["gpt2"]
    E, _ = expected_canonical("gpt2", model)
    _, w = load_hf(_resave(path, tmp_path / "gpt2", lambda k: k.replace("transformer.", "")))
    assert_canonical(w, E)


def test_gemma3_multimodal_wrapper(hf_dirs, tmp_path):
    """A Gemma3ForConditionalGeneration folder: text_config and model.language_model.* names."""
    model, path = hf_dirs["gemma3"]
    E, _ = expected_canonical("gemma3", model)

    def wrap(c):
        return {"model_type": "gemma3", "text_config": dict(c, model_type="gemma3_text")}
    d = _resave(path, tmp_path / "g3mm", lambda k: k.replace("model.", "model.language_model.", 1), wrap)
    cfg, w = load_hf(d)
    assert cfg.window == (5, 5, 5, 5, 5, 0, 5)
    assert_canonical(w, E)


def test_half_width_hf_matrices_stay_half(hf_dirs, tmp_path):
    """bf16/f16 safetensors: matrices stay 2-byte QuantizedTensor views (decoding to what
    torch's widening gives), vectors become float32."""
    model, _ = hf_dirs["qwen2"]
    for dtype, type_id in ((torch.bfloat16, 30), (torch.float16, 1)):
        d = tmp_path / str(dtype)
        model.to(dtype).save_pretrained(d, safe_serialization=True)
        _, w = load_hf(d)
        ref = {k: v.float().numpy() for k, v in model.state_dict().items()}
        q = w["blk.0.attn_q"]
        assert isinstance(q, QuantizedTensor) and q.type == type_id and q.data.dtype == np.uint8
        assert q.nbytes == 2 * H * HD * D
        assert np.array_equal(q.dequantize(), ref["model.layers.0.self_attn.q_proj.weight"])
        assert np.array_equal(np.asarray(q), q.dequantize())
        assert w["blk.0.attn_q_b"].dtype == np.float32
        assert np.array_equal(w["blk.0.attn_q_b"], ref["model.layers.0.self_attn.q_proj.bias"])
    model.float()


def test_unsupported_hf_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_neox"}))
    with pytest.raises(sl.UnsupportedArchitecture, match=r"unsupported architecture 'gpt_neox'.*supported: .*gemma3.*bert"):
        hf_loader.read_config(str(tmp_path))


# ------------------------------------------------------------------ GGUF
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3",
             "gpt2": "gpt2", "bert": "bert"}


def write_gguf(kind, model, path, qtype):
    """``model`` as llama.cpp's converter writes it: names, metadata, Gemma norms as 1 + w,
    GPT-2 Conv1D transposed with Q/K/V fused, no Q/K permutation (NEOX RoPE); 2-D weights in
    ``qtype``, position/type tables F16, 1-D tensors F32."""
    arch = GGUF_ARCH[kind]
    c = model.config
    E, _ = expected_canonical(kind, model)
    w = gguf.GGUFWriter(str(path), arch)
    p = arch + "."
    n_layers = c.num_hidden_layers
    w.add_uint32(p + "block_count", n_layers)
    w.add_uint32(p + "context_length", 96 if kind in ("gpt2", "bert") else c.max_position_embeddings)
    w.add_uint32(p + "embedding_length", D)
    w.add_uint32(p + "feed_forward_length", 4 * D if kind == "gpt2" else F)
    w.add_uint32(p + "attention.head_count", H)
    if kind in ("gpt2", "bert"):
        w.add_float32(p + "attention.layer_norm_epsilon", float(getattr(c, "layer_norm_epsilon", getattr(c, "layer_norm_eps", 1e-5))))
        if kind == "bert":
            w.add_bool(p + "attention.causal", False)
    else:
        w.add_uint32(p + "attention.head_count_kv", G)
        w.add_uint32(p + "attention.key_length", HD)
        w.add_uint32(p + "attention.value_length", HD)
        w.add_float32(p + "attention.layer_norm_rms_epsilon", float(c.rms_norm_eps))
        w.add_uint32(p + "rope.dimension_count", HD)
        rope = c.rope_parameters
        full = rope.get("full_attention", rope)
        w.add_float32(p + "rope.freq_base", float(full["rope_theta"]))
        if full.get("rope_type") == "linear":
            w.add_string(p + "rope.scaling.type", "linear")
            w.add_float32(p + "rope.scaling.factor", float(full["factor"]))
        if kind in ("gemma2", "gemma3"):
            w.add_uint32(p + "attention.sliding_window", c.sliding_window)
        if kind == "gemma2":
            w.add_float32(p + "attn_logit_softcapping", c.attn_logit_softcapping)
            w.add_float32(p + "final_logit_softcapping", c.final_logit_softcapping)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    qt = getattr(gguf.GGMLQuantizationType, qtype)

    def add(name, a, matrix=True):
        a = np.ascontiguousarray(a, np.float32)
        if a.ndim == 1:
            w.add_tensor(name, a)
        elif not matrix:
            w.add_tensor(name, a.astype(np.float16))
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    names = {"attn_q": "attn_q", "attn_k": "attn_k", "attn_v": "attn_v", "attn_output": "attn_output",
             "attn_norm": "attn_norm", "attn_q_norm": "attn_q_norm", "attn_k_norm": "attn_k_norm",
             "attn_post_norm": "post_attention_norm", "ffn_norm": "ffn_norm", "ffn_post_norm": "post_ffw_norm",
             "ffn_gate": "ffn_gate", "ffn_up": "ffn_up", "ffn_down": "ffn_down",
             "attn_res_norm": "attn_output_norm", "ffn_res_norm": "layer_output_norm"}
    glob = {"tok_embd": "token_embd", "out_norm": "output_norm", "embd_norm": "token_embd_norm",
            "pos_embd": "position_embd", "lm_head": "output"}
    for key, a in E.items():
        if key == "lm_head" and getattr(c, "tie_word_embeddings", True):
            continue
        if key == "type_embd":
            full_types = model.embeddings.token_type_embeddings.weight.detach().float().numpy()
            add("token_types.weight", full_types, matrix=False)
            continue
        bias = key.endswith("_b")
        stem = key[:-2] if bias else key
        suffix = ".bias" if bias else ".weight"
        if stem.startswith("blk."):
            _, l, sub = stem.split(".", 2)
            if kind == "gpt2" and sub in ("attn_q", "attn_k", "attn_v"):
                if sub == "attn_q":  # the converter keeps c_attn fused
                    cat = np.concatenate([E[f"blk.{l}.attn_{n}{'_b' if bias else ''}"] for n in "qkv"])
                    add(f"blk.{l}.attn_qkv{suffix}", cat)
                continue
            add(f"blk.{l}.{names[sub]}{suffix}", a)
        else:
            add(glob[stem] + suffix, a, matrix=stem not in ("pos_embd",))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return E


GGUF_KINDS = ("qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "bert")


@pytest.mark.parametrize("qtype", ["Q8_0", "F16"])
@pytest.mark.parametrize("kind", GGUF_KINDS)
def test_gguf_tensors_stay_quantized_and_decode_exactly(hf_dirs, tmp_path, kind, qtype):
    model, path = hf_dirs[kind]
    f = tmp_path / f"{kind}.gguf"
    E = write_gguf(kind, model, f, qtype)
    reader = gguf_loader.open_gguf(str(f))
    cfg = gguf_loader.read_config(reader)
    w = gguf_loader.load_gguf_weights(reader, cfg)
    assert sorted(w) == sorted(E)
    type_id = int(getattr(gguf.GGMLQuantizationType, qtype))
    for k, ref in E.items():
        got = w[k]
        if base.is_matrix(k):
            assert isinstance(got, QuantizedTensor) and got.type == type_id, k
            assert got.shape == ref.shape and got.data.dtype == np.uint8 and got.data.flags.c_contiguous, k
            # gguf's reference decoder on the very bytes the model keeps
            ref_decoded = gguf.quants.dequantize(got.data.reshape(got.shape[0], -1), type_id).reshape(got.shape)
            assert np.array_equal(got.dequantize(), ref_decoded), k
            # and those bytes are the right tensor: the HF matrix through the same encoding
            want = ref.astype(np.float16).astype(np.float32) if qtype == "F16" else \
                gguf.quants.dequantize(gguf.quants.quantize(np.ascontiguousarray(ref), type_id), type_id)
            assert np.array_equal(ref_decoded, want), k
        else:
            assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == ref.shape, k
            want = ref.astype(np.float16).astype(np.float32) if k in ("pos_embd", "type_embd") else ref
            assert np.array_equal(got, want), k
    if cfg.tied_embeddings:
        assert w["lm_head"] is w["tok_embd"]


def _effective(cfg):
    core = cfg.core_config(0)
    core.setdefault("attn_scale", 1.0 / math.sqrt(cfg.head_dim))
    core.pop("rope_layout")
    inv = layer_inv_freq(cfg) if cfg.positions == "rope" else None
    return core, inv, (cfg.positions, cfg.n_pos, cfg.layer_norms, cfg.biases, cfg.has_lm_head, cfg.has_out_norm,
                       cfg.embd_norm, cfg.type_embd, cfg.family)


@pytest.mark.parametrize("kind", GGUF_KINDS)
def test_gguf_config_equals_hf_config(hf_dirs, tmp_path, kind):
    model, path = hf_dirs[kind]
    f = tmp_path / f"{kind}.gguf"
    write_gguf(kind, model, f, "F16")
    a = _effective(gguf_loader.read_config(gguf_loader.open_gguf(str(f))))
    b = _effective(hf_loader.read_config(str(path)))
    if kind == "gemma2":
        # GGUF has no query_pre_attn_scalar: llama.cpp uses 1/sqrt(head_dim) (1/sqrt(d/H) for the 27B)
        assert a[0]["attn_scale"] == 1.0 / math.sqrt(HD) and b[0]["attn_scale"] == 24 ** -0.5
        b[0]["attn_scale"] = a[0]["attn_scale"]
    assert sorted(a[0]) == sorted(b[0]) and a[2] == b[2]
    for k, v in b[0].items():  # GGUF stores floats as float32
        assert a[0][k] == (pytest.approx(v, rel=1e-6) if isinstance(v, float) else v), k
    if b[1] is None:
        assert a[1] is None
    else:
        assert np.array_equal(a[1], b[1])
    assert gguf_loader.rope_layout(gguf_loader.read_config(gguf_loader.open_gguf(str(f)))) == 0


def test_gguf_gemma3_pattern_from_llama_cpp(hf_dirs, tmp_path):
    """Without a pattern key, llama.cpp slides on layers l % 6 < 5 and uses base 10000 there."""
    model, _ = hf_dirs["gemma3"]
    f = tmp_path / "g3.gguf"
    write_gguf("gemma3", model, f, "F16")
    cfg = gguf_loader.read_config(gguf_loader.open_gguf(str(f)))
    assert cfg.window == (5, 5, 5, 5, 5, 0, 5)
    assert cfg.layer_rope(0) == (10000.0, None)
    assert cfg.layer_rope(5) == (1e6, {"rope_type": "linear", "factor": 4.0})


def test_gguf_unsupported_architecture_names_the_list(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"unsupported architecture 'mamba' \(supported: llama, qwen2, qwen3, gemma") as e:
        gguf_loader.read_config(gguf_loader.open_gguf(str(tmp_path / "m.gguf")))
    assert isinstance(e.value, sl.UnsupportedArchitecture)


def test_quantized_tensor_rows_share_bytes():
    """Splitting a fused Q8_0 matrix by rows keeps the bytes and decodes to the same rows."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((12, 64)).astype(np.float32)
    raw = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0).reshape(-1)
    q = QuantizedTensor(8, raw, a.shape)
    part = q.rows(4, 8)
    assert np.shares_memory(part.data, raw) and part.shape == (4, 64)
    assert np.array_equal(part.dequantize(), q.dequantize()[4:8])
    assert np.array_equal(to_f32(part), part.dequantize())
    with pytest.raises(ValueError, match="needs"):
        QuantizedTensor(8, raw[:-1], a.shape)


def test_integer_buffers_in_safetensors_are_skipped_not_fatal(hf_dirs, tmp_path):
    """sentence-transformers' BERT files carry int64 ``embeddings.position_ids``: the file
    still loads; a weight stored with an integer dtype is an error naming it."""
    from safetensors.numpy import load_file, save_file
    import shutil

    model, path = hf_dirs["bert"]
    d = tmp_path / "bert"
    shutil.copytree(path, d)
    (st,) = [p for p in d.iterdir() if p.suffix == ".safetensors"]
    tensors = load_file(str(st))
    tensors["embeddings.position_ids"] = np.arange(96, dtype=np.int64)[None]
    save_file(tensors, str(st))
    E, _ = expected_canonical("bert", model)
    _, w = load_hf(d)
    assert_canonical(w, E)
    tensors["embeddings.LayerNorm.bias"] = tensors["embeddings.LayerNorm.bias"].astype(np.int32)
    save_file(tensors, str(st))
    with pytest.raises(hf_loader.SafetensorsError, match="embeddings.LayerNorm.bias has unsupported dtype I32"):
        load_hf(d)


@pytest.mark.parametrize("name", ["gemma2", "gpt2", "bert", "qwen2"])
def test_oversquashing_bound_refuses_other_blocks(tmp_path, name):
    """The over-squashing bound's constants are derived for the LLaMA block: another family gets
    a ValueError naming what differs, not a silently wrong bound."""
    store = rm.FamilyModels(tmp_path)
    model = sl.load(store.path(name, "st"))
    with pytest.raises(ValueError, match="derived for the LLaMA block"):
        sl.oversquashing_bound(model, np.arange(1, 9), target=-1)
