"""Reference models for parity tests: random tiny LLaMA models built with Hugging Face
`transformers`, written to disk as safetensors folders and as GGUF files, and the reference
forward (fp32 eager attention on CPU) that sinklab's traces are compared with.

Nothing here imports sinklab: the reference side is independent of the code under test.

Conventions (they match `sinklab.Model.run`):
  logits (T, V); resid (L+1, T, d) = residual stream entering each layer, resid[L] = output of
  the last decoder layer BEFORE the final norm; attn (L, H, T, T). With 2-D ids (B, T) every
  array gets a leading batch axis.

GGUF files are written the way llama.cpp's convert_hf_to_gguf.py writes a LlamaForCausalLM:
Q and K rows permuted by `llama_cpp_permute` (undoing HF's rotate-half layout into llama.cpp's
interleaved-pair layout), 1-D norm weights always F32, every 2-D weight in the requested type,
`output.weight` left out when embeddings are tied, llama3 rope scaling stored as a
`rope_freqs.weight` tensor, linear rope scaling as rope.scaling.{type,factor} metadata.
Checked in tests/test_parity_tiny.py ("reference self-checks"): transformers' own GGUF loader
reads back exactly the reference weights. (A llama.cpp cross-check, which needed
llama-cpp-python compiled from source, was removed: it could never run in CI.)
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import pytest

REFERENCE_ENV = "SINKLAB_REQUIRE_REFERENCE"


def require(module_name: str):
    """Import a reference-only dependency (torch, transformers, gguf, psutil, ...).

    Skips the calling test module when it is missing, unless SINKLAB_REQUIRE_REFERENCE=1, in
    which case the ImportError propagates and the test run fails: CI sets it so that a broken
    install cannot turn every parity test into a silent skip.
    """
    if os.environ.get(REFERENCE_ENV, "").strip() == "1":
        return importlib.import_module(module_name)
    return pytest.importorskip(module_name)


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TinySpec:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int = 320
    context_length: int = 256
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = None   # HF rope_parameters minus rope_theta
    norm_eps: float = 1e-5
    tied: bool = False
    seed: int = 0
    # write config.json the way pre-5.0 transformers and the Hub checkpoints do
    # (top-level rope_theta, "rope_scaling", "torch_dtype") instead of 5.x "rope_parameters"
    legacy_config: bool = False

    @property
    def q8_ok(self) -> bool:
        """Q8_0 needs every row length (input dim of each matrix) to be a multiple of 32."""
        return all(n % 32 == 0 for n in (self.d_model, self.n_heads * self.head_dim, self.d_ff))

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")


SPECS: Dict[str, TinySpec] = {
    s.name: s
    for s in [
        # plain multi-head attention, untied, 5.x config layout
        TinySpec("mha", d_model=64, n_layers=3, n_heads=4, n_kv_heads=4, head_dim=16, d_ff=160,
                 seed=1),
        # grouped-query attention (3 query heads per kv head), tied embeddings, SmolLM2-like
        # rope base, legacy config layout
        TinySpec("gqa_tied", d_model=96, n_layers=4, n_heads=6, n_kv_heads=2, head_dim=16,
                 d_ff=256, rope_theta=100000.0, tied=True, seed=2, legacy_config=True),
        # Llama 3.x rope scaling; original context 32 so that with head_dim 16 the rotation
        # frequencies fall in all three bands (unscaled, smoothed, scaled by `factor`)
        TinySpec("llama3", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 d_ff=128, seed=3, legacy_config=True,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        # linear position interpolation, tied
        TinySpec("linear", d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16,
                 d_ff=128, tied=True, seed=4,
                 rope_scaling={"rope_type": "linear", "factor": 4.0}),
        # odd sizes: d=72, head_dim 24, 3 heads sharing one kv head (MQA), 5 layers, d_ff and
        # vocab not multiples of anything nice, eps 1e-6
        TinySpec("odd", d_model=72, n_layers=5, n_heads=3, n_kv_heads=1, head_dim=24, d_ff=200,
                 vocab_size=301, norm_eps=1e-6, seed=5, legacy_config=True),
    ]
}


# --------------------------------------------------------------------------------------------
# Tokenizer (tiny byte-level BPE, same vocabulary in tokenizer.json and in GGUF metadata)
# --------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]     # ids 0, 1, 2: unk, bos, eos
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"),
           ("o", "n"), ("Ġ", "s"), ("a", "t"), ("e", "n")]


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map, in GPT-2's order (printable
    bytes first, then the rest mapped to 256 + n): the tests' one copy, written from GPT-2's
    encoder.py and checked against tokenizers' ByteLevel in tests/test_support.py, never
    imported from sinklab (the code under test)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_vocab(vocab_size: int):
    """(tokens, token_types, merges) of length vocab_size; llama.cpp token types."""
    b2u = bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    types = [3] * len(SPECIAL_TOKENS) + [1] * 256            # CONTROL, NORMAL
    merges = []
    for a, b in _MERGES:
        if len(tokens) >= vocab_size:
            break
        tokens.append(a + b)
        types.append(1)
        merges.append(f"{a} {b}")
    i = 0
    while len(tokens) < vocab_size:
        tokens.append(f"<extra_{i}>")
        types.append(5)                                       # UNUSED
        i += 1
    if len(tokens) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} too small for the byte-level vocabulary")
    return tokens, types, merges


def write_hf_tokenizer(directory: Path, vocab_size: int) -> None:
    """tokenizer.json + tokenizer_config.json for the tiny byte-level BPE vocabulary."""
    tokenizers = require("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    tokens, types, merges = tiny_vocab(vocab_size)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges],
                                          unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "model_max_length": 1 << 20,
    }, indent=2))


# --------------------------------------------------------------------------------------------
# HF model construction
# --------------------------------------------------------------------------------------------

def hf_config(spec: TinySpec):
    transformers = require("transformers")
    rope = {"rope_type": "default", "rope_theta": float(spec.rope_theta)}
    if spec.rope_scaling:
        rope = dict(spec.rope_scaling, rope_theta=float(spec.rope_theta))
    kwargs = dict(
        vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.d_ff,
        num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.context_length, rms_norm_eps=spec.norm_eps,
        tie_word_embeddings=spec.tied, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
    )
    params = inspect.signature(transformers.LlamaConfig.__init__).parameters
    if "rope_parameters" in params:          # transformers >= 5
        kwargs["rope_parameters"] = rope
    else:                                    # transformers 4.x
        kwargs["rope_theta"] = float(spec.rope_theta)
        kwargs["rope_scaling"] = dict(spec.rope_scaling) if spec.rope_scaling else None
    cfg = transformers.LlamaConfig(**kwargs)
    cfg._attn_implementation = "eager"
    return cfg


def make_hf_model(spec: TinySpec):
    """Random fp32 LlamaForCausalLM (eager attention, eval mode) with non-trivial activations.

    Init (all from a torch.Generator seeded with spec.seed): embeddings N(0, 0.5^2);
    q/k N(0, (1.2/sqrt(d))^2) so attention logits have std ~1.5 (peaked but not one-hot);
    v, gate, up N(0, 1/d); o N(0, 1/(H*hd)); down N(0, 1/d_ff); lm_head N(0, 0.1^2);
    RMSNorm weights 1 + N(0, 0.2^2).
    """
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(spec.seed)
    model = transformers.LlamaForCausalLM(hf_config(spec))
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    model.config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(1000 + spec.seed)
    d, hd, H = spec.d_model, spec.head_dim, spec.n_heads

    def std_for(name: str) -> float:
        if "embed_tokens" in name:
            return 0.5
        if "lm_head" in name:
            return 0.1
        if "q_proj" in name or "k_proj" in name:
            return 1.2 / math.sqrt(d)
        if "o_proj" in name:
            return 1.0 / math.sqrt(H * hd)
        if "down_proj" in name:
            return 1.0 / math.sqrt(spec.d_ff)
        return 1.0 / math.sqrt(d)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:   # RMSNorm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std_for(name) * torch.randn(p.shape, generator=g))
    if spec.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()
    return model


def _weight_matrices(model):
    """Named 2-D weight parameters (the ones a GGUF file would quantize), tied ones once."""
    seen, out = set(), []
    for name, p in model.named_parameters():
        if p.ndim == 2 and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            out.append((name, p))
    return out


def rounded_model(model, dtype: str):
    """Copy of `model` whose weights went through `dtype` ("float16"/"bfloat16") and back to
    fp32: the exact fp32 model a loader sees after upcasting an f16/bf16 checkpoint."""
    torch = require("torch")
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    m = copy.deepcopy(model)
    with torch.no_grad():
        for _, p in m.named_parameters():
            p.copy_(p.to(tdt).to(torch.float32))
    return m


def dequantized_model(model, qtype: str):
    """Copy of `model` with every 2-D weight replaced by quantize -> dequantize in GGUF type
    `qtype` ("F32", "F16", "Q8_0"; norms stay F32), i.e. exactly the weights stored in the
    GGUF file written by `write_gguf(model, ..., qtype)`. The Q/K permutation moves whole rows
    and the block formats quantize within a row, so quantizing before or after it is the same.
    """
    torch = require("torch")
    gguf = require("gguf")
    m = copy.deepcopy(model)
    if qtype == "F32":
        return m
    with torch.no_grad():
        for _, p in _weight_matrices(m):
            w = p.detach().cpu().numpy().astype(np.float32)
            if qtype == "F16":
                deq = w.astype(np.float16).astype(np.float32)
            else:
                qt = getattr(gguf.GGMLQuantizationType, qtype)
                deq = gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt).astype(np.float32)
                deq = deq.reshape(w.shape)
            p.copy_(torch.from_numpy(deq))
    return m


# --------------------------------------------------------------------------------------------
# Writing models to disk
# --------------------------------------------------------------------------------------------

def _legacy_config_json(path: Path) -> None:
    """Rewrite a transformers-5 config.json into the pre-5 layout used by Hub checkpoints."""
    cfg = json.loads(path.read_text())
    rp = cfg.pop("rope_parameters", None) or {}
    cfg["rope_theta"] = float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rtype = rp.get("rope_type", "default")
    if rtype == "default":
        cfg["rope_scaling"] = None
    elif rtype == "linear":                 # old-style key "type"
        cfg["rope_scaling"] = {"type": "linear", "factor": float(rp["factor"])}
    else:                                   # Llama 3.1 style
        cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def save_hf(model, directory, dtype: str = "float32", max_shard_size=None,
            legacy_config: bool = False, tokenizer: bool = True) -> Path:
    """save_pretrained as safetensors in `dtype`; sharded (model.safetensors.index.json) when
    max_shard_size is given (e.g. "40KB"). Returns the directory."""
    torch = require("torch")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    m = model if tdt == torch.float32 else copy.deepcopy(model).to(tdt)
    kwargs = {}
    params = inspect.signature(m.save_pretrained).parameters
    if "safe_serialization" in params:      # transformers 4.x; 5.x always writes safetensors
        kwargs["safe_serialization"] = True
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    m.save_pretrained(str(directory), **kwargs)
    if not list(directory.glob("*.safetensors")):
        raise RuntimeError(f"save_pretrained wrote no safetensors in {directory}")
    if max_shard_size is not None and not (directory / "model.safetensors.index.json").exists():
        raise RuntimeError("expected a sharded checkpoint (model.safetensors.index.json)")
    if legacy_config:
        _legacy_config_json(directory / "config.json")
    if tokenizer:
        write_hf_tokenizer(directory, model.config.vocab_size)
    return directory


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: Optional[int] = None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (Q: (w, H, H); K: (w, H, H_kv))."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def llama3_rope_factors(head_dim: int, rope_theta: float, rope_scaling: Dict[str, Any]) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py computes it for rope_type llama3
    (frequency divisors, one per rotated pair)."""
    torch = require("torch")
    factor = rope_scaling.get("factor", 8.0)
    low_freq_factor = rope_scaling.get("low_freq_factor", 1.0)
    high_freq_factor = rope_scaling.get("high_freq_factor", 4.0)
    old_context_len = rope_scaling.get("original_max_position_embeddings", 8192)
    freqs = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


_GGUF_FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7}


def write_gguf(model, path, qtype: str = "F32", name: str = "sinklab-tiny") -> Path:
    """Write `model` (a LlamaForCausalLM) to a llama.cpp-compatible GGUF file, 2-D weights in
    `qtype` ("F32", "F16", "Q8_0")."""
    gguf = require("gguf")
    path = Path(path)
    cfg = model.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    scaling = dict(rope) if rope else dict(getattr(cfg, "rope_scaling", None) or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type(_GGUF_FILE_TYPE[qtype])
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(rope_theta)
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(cfg.vocab_size)
    if hd != cfg.hidden_size // H:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(scaling["factor"]))
    # tokenizer: tiny byte-level BPE ("gpt2" in llama.cpp terms), same as tokenizer.json
    tokens, types, merges = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    qt = getattr(gguf.GGMLQuantizationType, qtype)

    def add(tname: str, t, is_matrix: bool):
        a = t.detach().cpu().float().numpy()
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not is_matrix or qtype == "F32":
            w.add_tensor(tname, a)
        elif qtype == "F16":
            w.add_tensor(tname, a.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(a, qt), raw_dtype=qt)

    torch = require("torch")
    sd = model.state_dict()
    add("token_embd.weight", sd["model.embed_tokens.weight"], True)
    if rope_type == "llama3":
        f = llama3_rope_factors(hd, rope_theta, scaling)
        w.add_tensor("rope_freqs.weight", np.ascontiguousarray(f, dtype=np.float32))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], False)
        q = sd[p + "self_attn.q_proj.weight"].detach().cpu().float().numpy()
        k = sd[p + "self_attn.k_proj.weight"].detach().cpu().float().numpy()
        add(f"blk.{i}.attn_q.weight", torch.from_numpy(llama_cpp_permute(q, H, H).copy()), True)
        add(f"blk.{i}.attn_k.weight", torch.from_numpy(llama_cpp_permute(k, H, Hkv).copy()), True)
        add(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"], True)
        add(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"], True)
        add(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], False)
        add(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"], True)
        add(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"], True)
        add(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"], True)
    add("output_norm.weight", sd["model.norm.weight"], False)
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"], True)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------------------------
# Reference forward
# --------------------------------------------------------------------------------------------

def hf_forward(model, ids) -> Dict[str, np.ndarray]:
    """fp32 eager forward of a LlamaForCausalLM; returns numpy logits, resid, attn in sinklab's
    layout (leading batch axis only when ids is 2-D)."""
    torch = require("torch")
    ids = np.asarray(ids, dtype=np.int64)
    batched = ids.ndim == 2
    ids2 = ids if batched else ids[None, :]
    grabbed = {}

    def hook(_mod, _inp, out):
        grabbed["last"] = out[0] if isinstance(out, (tuple, list)) else out

    h = model.model.layers[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(ids2), output_attentions=True,
                        output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    L = model.config.num_hidden_layers
    hs = list(out.hidden_states)
    assert len(hs) == L + 1, len(hs)
    resid = torch.stack(hs[:L] + [grabbed["last"]], dim=1)      # (B, L+1, T, d)
    attn = torch.stack(list(out.attentions), dim=1)             # (B, L, H, T, T)
    res = {
        "logits": out.logits.float().numpy(),
        "resid": resid.float().numpy(),
        "attn": attn.float().numpy(),
    }
    if not batched:
        res = {k: v[0] for k, v in res.items()}
    return res


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------

RTOL = 1e-4


def max_err(got, ref):
    """(max|got-ref|, max|ref|) in float64."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(got - ref))) if got.size else 0.0, float(np.max(np.abs(ref))) if ref.size else 0.0


def assert_close(name: str, got, ref, rtol: float = RTOL) -> Dict[str, float]:
    """max|got-ref| <= rtol * max|ref| for one tensor; returns the measured errors."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != reference {ref.shape}"
    assert np.all(np.isfinite(got)), f"{name}: non-finite values"
    err, scale = max_err(got, ref)
    rel = err / scale if scale > 0 else err
    assert err <= rtol * scale, (
        f"{name}: max|diff| = {err:.3e} > {rtol:g} * max|ref| = {rtol * scale:.3e} "
        f"(relative {rel:.3e})")
    return {"max_abs": err, "max_ref": scale, "rel": rel}


def check_attn_structure(name: str, attn, atol: float = 1e-5) -> None:
    """Rows sum to 1, exact zeros strictly above the diagonal, values in [0, 1]."""
    a = np.asarray(attn)
    T = a.shape[-1]
    assert a.shape[-2] == T
    upper = np.triu(np.ones((T, T), dtype=bool), k=1)
    assert not np.any(a[..., upper]), f"{name}: non-zero attention above the diagonal"
    s = a.sum(axis=-1, dtype=np.float64)
    assert np.max(np.abs(s - 1.0)) <= atol, f"{name}: rows do not sum to 1 (max dev {np.max(np.abs(s - 1.0)):.2e})"
    assert a.min() >= 0.0 and a.max() <= 1.0 + 1e-6, f"{name}: values outside [0, 1]"


def random_ids(vocab_size: int, T: int, seed: int, batch: Optional[int] = None, bos: bool = True):
    rng = np.random.default_rng(seed)
    shape = (T,) if batch is None else (batch, T)
    ids = rng.integers(3, vocab_size, size=shape, dtype=np.int64)
    if bos:
        ids[..., 0] = BOS_ID
    return ids


def merge_report(path: Optional[str], section: str, payload: Any) -> None:
    """Store payload under `section` in the JSON file at `path` (kept across test modules)."""
    if not path:
        return
    p = Path(path)
    data = {}
    if p.exists():
        try:
            data = json.loads(p.read_text())
        except ValueError:
            data = {}
    data[section] = payload
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2, sort_keys=True))


class ErrorLog:
    """Collects measured errors per (case, tensor) and prints/saves a summary at the end of a
    test module (see `report_fixture`)."""

    def __init__(self, section: str):
        self.section = section
        self.rows = []          # dicts: case, tensor, max_abs, max_ref, rel
        self.notes = []

    def compare(self, case: str, tensor: str, got, ref, rtol: float = RTOL) -> Dict[str, float]:
        try:
            e = assert_close(f"{case} {tensor}", got, ref, rtol=rtol)
        except AssertionError:
            if np.shape(got) == np.shape(ref):
                err, scale = max_err(got, ref)
                self.rows.append({"case": case, "tensor": tensor, "max_abs": err, "max_ref": scale,
                                  "rel": err / scale if scale else err, "failed": True})
            raise
        self.rows.append(dict(case=case, tensor=tensor, **e))
        return e

    def compare_trace(self, case: str, tr, ref, layers=None, rtol: float = RTOL) -> None:
        """logits as one tensor; resid and attn layer by layer (each against its own max),
        which is stricter than one max over all layers."""
        self.compare(case, "logits", tr.logits, ref["logits"], rtol)
        resid = np.asarray(tr.resid)
        assert resid.shape == ref["resid"].shape, f"{case} resid: shape {resid.shape} != {ref['resid'].shape}"
        for l in range(resid.shape[-3]):
            self.compare(case, f"resid[{l}]", resid[..., l, :, :], ref["resid"][..., l, :, :], rtol)
        ra = ref["attn"] if layers is None else np.take(ref["attn"], list(layers), axis=-4)
        attn = np.asarray(tr.attn)
        assert attn.shape == ra.shape, f"{case} attn: shape {attn.shape} != {ra.shape}"
        check_attn_structure(f"{case} attn", attn)
        for i in range(attn.shape[-4]):
            l = i if layers is None else list(layers)[i]
            self.compare(case, f"attn[{l}]", attn[..., i, :, :, :], ra[..., i, :, :, :], rtol)

    def summary(self) -> Dict[str, Any]:
        """Worst relative error per tensor kind (logits / resid / attn) and per case."""
        kinds: Dict[str, Dict[str, Any]] = {}
        for r in self.rows:
            kind = r["tensor"].split("[")[0]
            k = kinds.setdefault(kind, {"rel": -1.0})
            if r["rel"] > k["rel"]:
                kinds[kind] = {"rel": r["rel"], "max_abs": r["max_abs"], "max_ref": r["max_ref"],
                               "case": r["case"], "tensor": r["tensor"]}
        cases: Dict[str, Dict[str, float]] = {}
        for r in self.rows:
            kind = r["tensor"].split("[")[0]
            c = cases.setdefault(r["case"], {})
            c[kind] = max(c.get(kind, 0.0), r["rel"])
            c[kind + "_abs"] = max(c.get(kind + "_abs", 0.0), r["max_abs"])
        return {"worst": kinds, "cases": cases, "notes": self.notes, "n_compared": len(self.rows)}

    def format(self) -> str:
        s = self.summary()
        lines = [f"[{self.section}] parity vs transformers: {s['n_compared']} tensors compared "
                 f"(bound: max|diff| <= {RTOL:g} * max|ref|)"]
        for kind, w in sorted(s["worst"].items()):
            lines.append(f"  {kind:7s} worst rel {w['rel']:.2e} (max|diff| {w['max_abs']:.2e}, "
                         f"max|ref| {w['max_ref']:.3g}) at {w['case']} {w['tensor']}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def report_fixture(request, log: ErrorLog, per_case: bool = False) -> None:
    """Register a finalizer that prints `log` on the terminal (also without -s) and merges it
    into the JSON file named by SINKLAB_PARITY_REPORT."""

    def fin():
        if not log.rows and not log.notes:
            return
        text = log.format()
        if per_case:
            s = log.summary()
            for case, c in s["cases"].items():
                text += "\n    " + case + ": " + ", ".join(
                    f"{k} {v:.2e}" for k, v in sorted(c.items()) if not k.endswith("_abs"))
        pm = request.config.pluginmanager
        tr = pm.get_plugin("terminalreporter")
        capman = pm.get_plugin("capturemanager")
        if tr is not None:
            # fixture teardown runs under output capture; lift it so the summary is shown
            # without -s
            ctx = capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext()
            with ctx:
                tr.write_line("")
                for line in text.splitlines():
                    tr.write_line(line)
        else:
            print(text)
        merge_report(os.environ.get("SINKLAB_PARITY_REPORT"), log.section, log.summary())

    request.addfinalizer(fin)


# --------------------------------------------------------------------------------------------
# The HF reference of a real GGUF file, cached on disk across runs
# --------------------------------------------------------------------------------------------
#
# transformers' GGUF loader dequantizes every tensor in NumPy: 20 s for SmolLM2, longer for
# Gemma 3 and Qwen2.5 on 2 cores, per test session. Its result (the fp32 state dict and the
# config it derived) is stored once as a plain safetensors folder, keyed by the GGUF file's
# sha256 and the torch/transformers/gguf versions that made it; loading that folder takes well
# under a second and gives the same tensors bit for bit (tests/test_support.py checks it).

def reference_cache_root() -> Path:
    """Where cached references live: ``$SINKLAB_HOME/test-references`` (default
    ``~/.cache/sinklab/test-references``, next to the fetched models)."""
    home = os.environ.get("SINKLAB_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "sinklab")
    return Path(home) / "test-references"


def file_sha256(path) -> str:
    """sha256 hex of a file, remembered on disk by (path, size, mtime, inode) so that a second
    session does not re-read a 500 MB model to find its cache key."""
    import hashlib

    p = Path(path).resolve()
    st = p.stat()
    stamp = [str(p), st.st_size, st.st_mtime_ns, st.st_ino]
    memo = reference_cache_root() / "sha256" / (hashlib.sha256(str(p).encode()).hexdigest()[:32] + ".json")
    try:
        rec = json.loads(memo.read_text())
        if rec["stamp"] == stamp:
            return rec["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"stamp": stamp, "sha256": digest}))
    os.replace(tmp, memo)
    return digest


def _reference_key(path: Path) -> str:
    """The file's sha256 plus the versions of the stack that dequantized it: a new transformers
    (or gguf) could dequantize differently, and must not reuse an old reference."""
    import hashlib

    torch, transformers, gguf = require("torch"), require("transformers"), require("gguf")
    versions = f"torch={torch.__version__} transformers={transformers.__version__} gguf={getattr(gguf, '__version__', '?')}"
    return file_sha256(path) + "-" + hashlib.sha256(versions.encode()).hexdigest()[:12]


def _load_gguf_fresh(p: Path):
    """transformers' fp32 eager model from the GGUF through its own loader (un-permutes Q/K)."""
    torch = require("torch")
    transformers = require("transformers")
    require("gguf")
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    return ref


def _save_reference(ref, folder: Path) -> None:
    """The dequantized model as a plain fp32 safetensors folder, written to a temporary folder
    and renamed into place (a killed session leaves no half-written reference)."""
    from safetensors.torch import save_model

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir()
    cfg = copy.deepcopy(ref.config)
    if hasattr(cfg, "quantization_config"):   # the weights are fp32 now: no GGUF quantizer
        del cfg.quantization_config
    cfg.save_pretrained(str(tmp))
    save_model(ref, str(tmp / "model.safetensors"))   # tied embeddings stored once
    try:
        os.rename(tmp, folder)
    except OSError:                          # another session stored it first: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def hf_gguf_model(path: str, use_cache: bool = True):
    """A new HF fp32 eager model of a GGUF file, as transformers' own GGUF loader dequantizes
    it, read from the on-disk cache (see reference_cache_root; filled on first use). Not kept
    in memory here: Gemma 3 and Qwen2.5 in fp32 take 1-2 GB each, so their fixtures hold them
    only as long as their tests run. ``use_cache=False``: dequantize again, store nothing."""
    torch = require("torch")
    transformers = require("transformers")
    p = Path(path)
    if not use_cache:
        return _load_gguf_fresh(p)
    folder = reference_cache_root() / _reference_key(p)
    if not (folder / "model.safetensors").is_file():
        _save_reference(_load_gguf_fresh(p), folder)
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    return ref


@functools.lru_cache(maxsize=None)
def hf_gguf_tokenizer(path: str):
    """transformers' tokenizer built from the GGUF file itself (a few seconds; not cached on
    disk, so the tokenizer reference is exactly what transformers reads from the file)."""
    transformers = require("transformers")
    require("gguf")
    p = Path(path)
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@functools.lru_cache(maxsize=1)
def hf_gguf_reference(path: str):
    """(HF fp32 eager model, HF tokenizer) of a GGUF file, loaded once per session (the model
    from the on-disk cache after the first session): many test modules compare against
    SmolLM2."""
    return hf_gguf_model(str(path)), hf_gguf_tokenizer(str(path))


class TinyModels:
    """Per-module cache of tiny random HF models (``SPECS``), their files (an F32 GGUF with
    llama.cpp's permuted Q/K rows for ``fmt="gguf"``, a safetensors folder otherwise) and the
    sinklab models loaded from them."""

    def __init__(self, root):
        self.root = root
        self._hf, self._sl = {}, {}

    def hf(self, spec: str):
        if spec not in self._hf:
            self._hf[spec] = make_hf_model(SPECS[spec])
        return self._hf[spec]

    def sl(self, spec: str, fmt: str):
        import sinklab

        key = (spec, fmt)
        if key not in self._sl:
            s = SPECS[spec]
            if fmt == "gguf":
                p = write_gguf(self.hf(spec), self.root / f"{spec}.gguf", "F32")
            else:
                p = save_hf(self.hf(spec), self.root / spec, legacy_config=s.legacy_config)
            self._sl[key] = sinklab.load(str(p), quiet=True)
        return self._sl[key]


# ============================================================================================
# Model families (issue 10): tiny random Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3,
# GPT-2 and BERT models, their GGUF files, and a family-agnostic reference forward
# ============================================================================================
#
# Each FamilySpec names a transformers class and its config keyword arguments. The model's
# facts (layers, heads, windows, ...) are read back from the HF config object, never restated.
# The reference forward reads the residual stream with hooks on the decoder layers (pre-hook:
# the stream entering layer l; forward hook on the last layer: its output BEFORE any final
# norm), and q/k/v/z/attention by wrapping the family module's eager_attention_forward, which
# receives the queries and keys after QK-norm and RoPE, in HF's rotate-half layout, and the
# keys/values per kv head (before repeat_kv).

GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3_text")

# HF model_type -> (transformers config class, model class, modeling module)
FAMILY_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "llama"),
    "mistral": ("MistralConfig", "MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "gemma"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "gemma2"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", "gpt2"),
    "bert": ("BertConfig", "BertModel", "bert"),
}

_DEC = dict(vocab_size=320, hidden_size=64, max_position_embeddings=256, bos_token_id=BOS_ID,
            eos_token_id=EOS_ID, pad_token_id=0)


@dataclass(frozen=True)
class FamilySpec:
    """A tiny random model of one family.

    hf: config keyword arguments. gguf_arch: llama.cpp architecture of its GGUF form (None: no
    GGUF test). gguf_hf: config overrides giving the model that llama.cpp's metadata can
    express (e.g. Gemma 2/3's attention scale is 1/sqrt(head_dim) in llama.cpp, which has no
    query_pre_attn_scalar key); weights are the same (same seed, same shapes). T: test length,
    longer than every sliding window.
    """
    name: str
    family: str
    hf: Dict[str, Any]
    seed: int
    gguf_arch: Optional[str] = None
    gguf_hf: Dict[str, Any] = field(default_factory=dict)
    T: int = 40
    # write config.json as pre-5.0 transformers and the Hub checkpoints do (legacy_family_config)
    legacy_config: bool = False

    @property
    def causal(self) -> bool:
        return self.family != "bert"

    @property
    def has_logits(self) -> bool:
        return self.family != "bert"


FAMILY_SPECS: Dict[str, FamilySpec] = {s.name: s for s in [
    FamilySpec("llama", "llama", dict(_DEC, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               tie_word_embeddings=False, hidden_act="silu"), seed=11, gguf_arch="llama"),
    # sliding window 12 < T on every layer
    FamilySpec("mistral", "mistral", dict(_DEC, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               sliding_window=12, tie_word_embeddings=False), seed=12, legacy_config=True),
    # QKV biases, tied embeddings, Qwen2.5's rope base and eps
    FamilySpec("qwen2", "qwen2", dict(_DEC, intermediate_size=160, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
               tie_word_embeddings=True, use_sliding_window=False), seed=13, gguf_arch="qwen2",
               legacy_config=True),
    # QK-norm, head_dim 24 != d/H = 16
    FamilySpec("qwen3", "qwen3", dict(_DEC, intermediate_size=128, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
               tie_word_embeddings=False, attention_bias=False), seed=14, gguf_arch="qwen3"),
    # GeGLU, 1+w norms, sqrt(d) embedding scale, MQA, head_dim 24 != d/H
    FamilySpec("gemma", "gemma", dict(_DEC, intermediate_size=160, num_hidden_layers=3,
               num_attention_heads=4, num_key_value_heads=1, head_dim=24, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True), seed=15),
    # soft-caps small enough to bite, alternating windows (layers 0, 2 sliding), window 10 < T,
    # query_pre_attn_scalar 24 != head_dim 16, pre/post norms
    FamilySpec("gemma2", "gemma2", dict(_DEC, intermediate_size=128, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
               attn_logit_softcapping=3.0, final_logit_softcapping=6.0, sliding_window=10,
               tie_word_embeddings=True), seed=16, gguf_arch="gemma2",
               gguf_hf=dict(query_pre_attn_scalar=16), legacy_config=True),
    # QK-norm, non-default layer_types, local rope base 20000 != global 1e6, window 10 < T,
    # query_pre_attn_scalar 32 != head_dim 24 (safetensors only: llama.cpp's metadata cannot
    # say any of the three)
    FamilySpec("gemma3", "gemma3_text", dict(_DEC, intermediate_size=128, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}},
               layer_types=["sliding_attention", "full_attention", "sliding_attention",
                            "sliding_attention"],
               hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32,
               sliding_window=10, final_logit_softcapping=None, attn_logit_softcapping=None,
               tie_word_embeddings=True), seed=17),
    # Gemma 3 as llama.cpp stores it: every 6th layer global, local rope base 10000 (both
    # hard-coded in llama.cpp), global base in rope.freq_base, scale 1/sqrt(head_dim)
    FamilySpec("gemma3_gguf", "gemma3_text", dict(_DEC, intermediate_size=128, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6,
               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
               hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32, sliding_window=10,
               tie_word_embeddings=True), seed=18, gguf_arch="gemma3", legacy_config=True),
    # Conv1D weights (in, out), learned positions, LayerNorm with biases, tied head
    FamilySpec("gpt2", "gpt2", dict(vocab_size=320, n_embd=64, n_layer=3, n_head=4, n_positions=64,
               n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
               bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=True,
               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), seed=19, gguf_arch="gpt2",
               # llama.cpp writes output.weight as a copy of token_embd: two tensors, an
               # untied model (as transformers' GGUF loader reads it too)
               gguf_hf=dict(tie_word_embeddings=False)),
    # post-LN encoder, token-type embeddings, erf GELU, bidirectional, no head
    FamilySpec("bert", "bert", dict(vocab_size=320, hidden_size=64, num_hidden_layers=3,
               num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), seed=20),
]}


def family_config(spec: FamilySpec, gguf: bool = False):
    """The transformers config of `spec` (with spec.gguf_hf applied when gguf), eager attention."""
    transformers = require("transformers")
    cls_name = FAMILY_CLASSES[spec.family][0]
    kwargs = copy.deepcopy(spec.hf)
    if gguf:
        kwargs.update(copy.deepcopy(spec.gguf_hf))
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg._attn_implementation = "eager"
    return cfg


def config_facts(cfg) -> Dict[str, Any]:
    """n_layers, n_heads, n_kv_heads, d_model, head_dim, vocab_size and the per-layer sliding
    windows (0 = full attention) of a transformers config of any supported family."""
    mt = cfg.model_type
    if mt == "gpt2":
        L, H, d = cfg.n_layer, cfg.n_head, cfg.n_embd
        G, hd = H, d // H
    else:
        L, H, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
        G = getattr(cfg, "num_key_value_heads", None) or H
        hd = getattr(cfg, "head_dim", None) or d // H
    windows = [0] * L
    lt = getattr(cfg, "layer_types", None)
    if mt == "mistral" and cfg.sliding_window:
        windows = [int(cfg.sliding_window)] * L
    elif lt and mt != "qwen2":
        windows = [int(cfg.sliding_window) if t == "sliding_attention" else 0 for t in lt]
    elif mt == "qwen2" and getattr(cfg, "use_sliding_window", False):
        raise NotImplementedError("qwen2 sliding windows are not used by the tiny specs")
    return dict(n_layers=L, n_heads=H, n_kv_heads=G, d_model=d, head_dim=hd,
                vocab_size=cfg.vocab_size, windows=windows)


def _init_std(name: str, d: int, qd: int, F: int) -> float:
    """Standard deviation of a random matrix by role (see make_family_model)."""
    if any(s in name for s in ("embed_tokens", "wte", "word_embeddings")):
        return 0.5
    if any(s in name for s in ("wpe", "position_embeddings", "token_type_embeddings")):
        return 0.2
    if "lm_head" in name:
        return 0.1
    if any(s in name for s in ("q_proj", "k_proj", "c_attn", ".query.", ".key.")):
        return 1.2 / math.sqrt(d)
    if "o_proj" in name or "attention.output.dense" in name or "attn.c_proj" in name:
        return 1.0 / math.sqrt(qd)
    if "down_proj" in name or "mlp.c_proj" in name or (name.endswith("output.dense.weight")
                                                       and "attention" not in name):
        return 1.0 / math.sqrt(F)
    return 1.0 / math.sqrt(d)


def make_family_model(spec: FamilySpec, gguf: bool = False):
    """Random fp32 model of `spec` (eager attention, eval mode), same weights for gguf=True.

    Init, from a torch.Generator seeded with spec.seed: matrices as make_hf_model (token
    embeddings N(0, 0.5^2), positions/token types N(0, 0.2^2), q/k N(0, (1.2/sqrt d)^2), ...);
    every bias N(0, 0.2^2); norm weights non-trivial: 1 + N(0, 0.2^2) as multipliers, i.e. the
    stored w ~ N(0, 0.2^2) for Gemma's (1 + w) norms.
    """
    torch = require("torch")
    transformers = require("transformers")
    cfg = family_config(spec, gguf)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, FAMILY_CLASSES[spec.family][1])(cfg)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    model.config._attn_implementation = "eager"
    f = config_facts(cfg)
    d, qd = f["d_model"], f["n_heads"] * f["head_dim"]
    F = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * d
    g = torch.Generator().manual_seed(2000 + spec.seed)
    gemma = spec.family in GEMMA_FAMILIES
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(_init_std(name, d, qd, F) * torch.randn(p.shape, generator=g))
        if spec.family == "gpt2" and not cfg.tie_word_embeddings:
            model.lm_head.weight.copy_(model.transformer.wte.weight)
    model.eval()
    return model


def family_layers(model):
    """The ModuleList of transformer blocks (decoder layers / GPT-2 h / BERT encoder.layer)."""
    base = model.base_model
    for attr in ("layers", "h"):
        if hasattr(base, attr):
            return getattr(base, attr)
    return base.encoder.layer


def _modeling_module(model):
    return importlib.import_module(type(model).__module__)


@contextlib.contextmanager
def recording_attention(model, record: list, replace=None):
    """Wrap the model family's eager_attention_forward: every call appends
    (query (B,H,T,hd) after QK-norm/RoPE, key (B,G,T,hd), value (B,G,T,hd),
    z (B,H,T,hd) = attention output before W_O, probs (B,H,T,T)). `replace`, when given, is
    called instead of the original with the same arguments (gradient tests' interventions)."""
    mod = _modeling_module(model)
    orig = mod.eager_attention_forward
    fn = replace or orig

    def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
        out, probs = fn(module, query, key, value, attention_mask, *args, **kwargs)
        record.append((query, key, value, out.transpose(1, 2), probs))
        return out, probs

    mod.eager_attention_forward = wrapped
    try:
        yield
    finally:
        mod.eager_attention_forward = orig


def family_resid(model, ids, at: Optional[int] = None, x=None, record: Optional[list] = None,
                 logits: bool = False, token_type_ids=None):
    """HF forward of ids (B, T) (a torch or numpy int array) with hooks; returns (resid: list
    of L+1 tensors (B, T, d) that are in the autograd graph, logits (B, T, V) or None).
    resid[l] = the stream entering block l; resid[L] = the last block's output (before GPT-2's
    ln_f and the decoders' final norm; BERT has none). With `at`, resid[at] is replaced by x
    (B, T, d) or (T, d)."""
    torch = require("torch")
    blocks = family_layers(model)
    L = len(blocks)
    resid: list = [None] * (L + 1)
    handles = []

    def put(h):
        return (x if x.ndim == 3 else x[None]).to(h.dtype)

    def pre(l):
        def hook(_mod, args, kwargs):
            if args:
                h = args[0]
                if at == l:
                    h = put(h)
                    args = (h,) + tuple(args[1:])
            else:
                h = kwargs["hidden_states"]
                if at == l:
                    h = put(h)
                    kwargs = dict(kwargs, hidden_states=h)
            resid[l] = h
            return args, kwargs
        return hook

    def post(_mod, _args, out):
        h = out[0] if isinstance(out, (tuple, list)) else out
        if at == L:
            h = put(h)
            out = h if not isinstance(out, (tuple, list)) else type(out)((h,) + tuple(out[1:]))
        resid[L] = h
        return out

    for l, blk in enumerate(blocks):
        handles.append(blk.register_forward_pre_hook(pre(l), with_kwargs=True))
    handles.append(blocks[-1].register_forward_hook(post))
    ids_t = torch.as_tensor(np.asarray(ids, np.int64))
    if ids_t.ndim == 1:
        ids_t = ids_t[None]
    kw = {"input_ids": ids_t}
    if model.config.model_type == "bert":
        kw["token_type_ids"] = (torch.zeros_like(ids_t) if token_type_ids is None
                                else torch.as_tensor(token_type_ids))
    else:
        kw["use_cache"] = False
    ctx = recording_attention(model, record) if record is not None else contextlib.nullcontext()
    try:
        with ctx:
            out = model(**kw)
    finally:
        for h in handles:
            h.remove()
    lg = getattr(out, "logits", None) if logits else None
    return resid, lg


def family_forward(model, ids) -> Dict[str, np.ndarray]:
    """fp32 eager reference of any family, numpy, sinklab's layout (leading batch axis only for
    2-D ids): resid (L+1, T, d); attn (L, H, T, T); q (L, H, T, hd), k and v (L, G, T, hd),
    z (L, H, T, hd); logits (T, V) (absent for BERT)."""
    torch = require("torch")
    ids = np.asarray(ids, dtype=np.int64)
    batched = ids.ndim == 2
    rec: list = []
    with torch.no_grad():
        resid, logits = family_resid(model, ids if batched else ids[None], record=rec, logits=True)
    L = len(resid) - 1
    assert len(rec) == L, f"recorded {len(rec)} attention calls for {L} layers"
    res = {"resid": torch.stack(resid, dim=1).float().numpy()}
    for i, name in enumerate(("q", "k", "v", "z", "attn")):
        res[name] = torch.stack([r[i] for r in rec], dim=1).float().numpy()
    if logits is not None:
        res["logits"] = logits.float().numpy()
    if not batched:
        res = {k: v[0] for k, v in res.items()}
    return res


def attention_stats64(attn: np.ndarray, causal: bool = True) -> Dict[str, np.ndarray]:
    """First-token importance, attention to position 0 and row entropy in float64 from
    attention probabilities (..., T, T): importance a_k = mean of A[i, k] over the queries
    that can see key k, i >= k when causal (T - k of them; with a sliding window the ones
    outside it have A[i, k] = 0 and still count, as in Gu et al.'s definition), every query
    (T of them) when bidirectional."""
    a = np.asarray(attn, dtype=np.float64)
    T = a.shape[-1]
    if causal:
        imp = np.tril(a).sum(axis=-2) / (T - np.arange(T, dtype=np.float64))
    else:
        imp = a.sum(axis=-2) / T
    ent = -np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0).sum(-1)
    return {"importance": imp, "to_first": a[..., :, 0], "entropy": ent}


# ---------------------------------------------------------------------------------- files

def legacy_family_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """A transformers-5 config.json dict in the layout of the Hub checkpoints (pre-5.0):
    top-level rope_theta (Gemma 3: and rope_local_base_freq), torch_dtype; Gemma 2 without
    layer_types (even layers slide), Gemma 3 with sliding_window_pattern 6 instead of
    layer_types; Qwen2 with a sliding_window number that use_sliding_window=false disables,
    as Qwen2.5's config.json has it."""
    cfg = dict(cfg)
    rp = cfg.pop("rope_parameters", None) or {}
    if "full_attention" in rp:
        cfg["rope_theta"] = float(rp["full_attention"]["rope_theta"])
        cfg["rope_local_base_freq"] = float(rp["sliding_attention"]["rope_theta"])
    elif rp:
        cfg["rope_theta"] = float(rp["rope_theta"])
    cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    mt = cfg["model_type"]
    if mt == "gemma2":
        cfg.pop("layer_types", None)
    elif mt == "gemma3_text":
        L = cfg["num_hidden_layers"]
        want = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(L)]
        assert cfg.pop("layer_types") == want, "legacy Gemma 3 configs can only say pattern 6"
        cfg["sliding_window_pattern"] = 6
    elif mt == "qwen2":
        assert not cfg.get("use_sliding_window")
        cfg["sliding_window"], cfg["max_window_layers"] = 16, 21
        cfg.pop("layer_types", None)
    return cfg


def save_family(model, directory, legacy_config: bool = False) -> Path:
    """save_pretrained (safetensors, fp32) plus the tiny tokenizer; config.json in the Hub's
    pre-5.0 layout when legacy_config."""
    directory = save_hf(model, directory)
    if legacy_config:
        path = Path(directory) / "config.json"
        path.write_text(json.dumps(legacy_family_config(json.loads(path.read_text())), indent=2,
                                   sort_keys=True))
    return directory


def _gguf_base_metadata(w, cfg, facts, qtype: str, name: str) -> None:
    gguf = require("gguf")
    w.add_name(name)
    w.add_file_type(_GGUF_FILE_TYPE[qtype])
    w.add_block_count(facts["n_layers"])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(facts["d_model"])
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(facts["n_heads"])
    w.add_head_count_kv(facts["n_kv_heads"])
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_vocab_size(cfg.vocab_size)
    tokens, types, merges = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_family_gguf(model, spec: FamilySpec, path, qtype: str = "F32",
                      name: str = "sinklab-tiny") -> Path:
    """Write `model` as llama.cpp's convert_hf_to_gguf.py writes its family (spec.gguf_arch).

    llama: write_gguf (Q/K rows permuted). qwen2/qwen3/gemma2/gemma3: NEOX rope, so Q/K rows
    as in HF (no permutation); 1-D tensors (norms, biases) F32, matrices in `qtype`;
    output.weight only when untied. Gemma norms (every *norm.weight, QK-norms included) are
    stored as 1 + w, computed in float32 as the converter does. Metadata: the converter's keys
    (qwen2/qwen3: rope.freq_base, key/value_length when head_dim is given; gemma2:
    key/value_length, attn/final logit soft-caps, sliding_window, no rope.freq_base; gemma3:
    key/value_length, rope.freq_base = the global base, sliding_window, final soft-cap when set).
    llama.cpp itself fixes what the file does not say: Gemma 2 windows on even layers,
    Gemma 3 windows on all but every 6th layer with local rope base 10000, and attention scale
    1/sqrt(head_dim) for both."""
    gguf = require("gguf")
    arch = spec.gguf_arch
    if arch == "llama":
        return write_gguf(model, path, qtype, name=name)
    if arch == "gpt2":
        return _write_gpt2_gguf(model, path, qtype, name)
    path = Path(path)
    cfg = model.config
    facts = config_facts(cfg)
    w = gguf.GGUFWriter(str(path), arch)
    _gguf_base_metadata(w, cfg, facts, qtype, name)
    gemma = arch.startswith("gemma")
    hd = facts["head_dim"]
    if gemma or arch == "qwen3" or hd != facts["d_model"] // facts["n_heads"]:
        w.add_key_length(hd)
        w.add_value_length(hd)
    rp = getattr(cfg, "rope_parameters", None) or {}
    if arch in ("qwen2", "qwen3"):
        w.add_rope_freq_base(float(rp["rope_theta"]))
    elif arch == "gemma2":
        w.add_attn_logit_softcapping(float(cfg.attn_logit_softcapping))
        w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
        w.add_sliding_window(int(cfg.sliding_window))
    elif arch == "gemma3":
        w.add_rope_freq_base(float(rp["full_attention"]["rope_theta"]))
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
        w.add_sliding_window(int(cfg.sliding_window))
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    sd = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}

    def add(tname: str, a: np.ndarray):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1:
            if gemma and tname.endswith("norm.weight"):
                a = (np.float32(1) + a).astype(np.float32)
            w.add_tensor(tname, a)
        elif qtype == "F32":
            w.add_tensor(tname, a)
        elif qtype == "F16":
            w.add_tensor(tname, a.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(a, qt), raw_dtype=qt)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    if gemma:
        names.update({"post_attention_layernorm": "post_attention_norm",
                      "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "post_ffw_norm"})
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    for i in range(facts["n_layers"]):
        p = f"model.layers.{i}."
        for hf_name, g_name in names.items():
            for suffix in ("weight", "bias"):
                key = f"{p}{hf_name}.{suffix}"
                if key in sd:
                    add(f"blk.{i}.{g_name}.{suffix}", sd[key])
    add("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _write_gpt2_gguf(model, path, qtype: str, name: str) -> Path:
    """GPT-2 as llama.cpp's GPT2Model converter writes it: Conv1D weights transposed to (out, in),
    Q/K/V fused as attn_qkv (3d, d) with its bias, LayerNorm eps under attention.layer_norm_epsilon,
    feed_forward_length 4d, and output.weight written as a copy of token_embd.weight."""
    gguf = require("gguf")
    path = Path(path)
    cfg = model.config
    d = cfg.n_embd
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_name(name)
    w.add_file_type(_GGUF_FILE_TYPE[qtype])
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(d)
    w.add_feed_forward_length(4 * d)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(float(cfg.layer_norm_epsilon))
    tokens, types, merges = tiny_vocab(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    sd = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}

    def add(tname: str, a: np.ndarray):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(tname, a)
        elif qtype == "F16":
            w.add_tensor(tname, a.astype(np.float16))
        else:
            w.add_tensor(tname, gguf.quants.quantize(a, qt), raw_dtype=qt)

    add("token_embd.weight", sd["transformer.wte.weight"])
    add("position_embd.weight", sd["transformer.wpe.weight"])
    for i in range(cfg.n_layer):
        p = f"transformer.h.{i}."
        for hf_name, g_name, conv in (("ln_1", "attn_norm", False), ("attn.c_attn", "attn_qkv", True),
                                      ("attn.c_proj", "attn_output", True), ("ln_2", "ffn_norm", False),
                                      ("mlp.c_fc", "ffn_up", True), ("mlp.c_proj", "ffn_down", True)):
            wt = sd[p + hf_name + ".weight"]
            add(f"blk.{i}.{g_name}.weight", wt.T if conv else wt)
            add(f"blk.{i}.{g_name}.bias", sd[p + hf_name + ".bias"])
    add("output_norm.weight", sd["transformer.ln_f.weight"])
    add("output_norm.bias", sd["transformer.ln_f.bias"])
    add("output.weight", sd["transformer.wte.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def dequantized_family(model, qtype: str):
    """Copy of `model` whose 2-D weights went through GGUF `qtype` (the weights a GGUF file
    written by write_family_gguf holds). GPT-2's Conv1D weights are quantized in the file's
    transposed (out, in) layout, whose rows are the blocks."""
    if model.config.model_type != "gpt2" or qtype == "F32":
        return dequantized_model(model, qtype)
    torch = require("torch")
    gguf = require("gguf")
    m = copy.deepcopy(model)
    qt = getattr(gguf.GGMLQuantizationType, qtype)
    with torch.no_grad():
        for name, p in _weight_matrices(m):
            w = p.detach().cpu().numpy().astype(np.float32)
            conv = any(s in name for s in ("c_attn", "c_proj", "c_fc"))
            a = np.ascontiguousarray(w.T if conv else w)
            if qtype == "F16":
                deq = a.astype(np.float16).astype(np.float32)
            else:
                deq = gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt).astype(np.float32).reshape(a.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(deq.T if conv else deq)))
    return m


class FamilyModels:
    """Per-module cache of the FAMILY_SPECS models: HF reference models, their files
    ("st": safetensors fp32 folder, "gguf": F32 GGUF, "gguf-Q8_0"/"gguf-F16") and the sinklab
    models loaded from the files. The reference for a GGUF form is the model built with
    spec.gguf_hf (what llama.cpp's metadata says), with the file's rounded weights."""

    def __init__(self, root):
        self.root = Path(root)
        self._hf, self._path, self._sl = {}, {}, {}

    def hf(self, name: str, fmt: str = "st"):
        key = (name, fmt)
        if key not in self._hf:
            spec = FAMILY_SPECS[name]
            if fmt == "st":
                m = make_family_model(spec)
            else:
                qtype = fmt.split("-", 1)[1] if "-" in fmt else "F32"
                m = make_family_model(spec, gguf=True)
                if qtype != "F32":
                    m = dequantized_family(m, qtype)
            self._hf[key] = m
        return self._hf[key]

    def path(self, name: str, fmt: str = "st") -> Path:
        key = (name, fmt)
        if key not in self._path:
            spec = FAMILY_SPECS[name]
            if fmt == "st":
                p = save_family(self.hf(name, "st"), self.root / name, legacy_config=spec.legacy_config)
            else:
                qtype = fmt.split("-", 1)[1] if "-" in fmt else "F32"
                # write from the unrounded weights: the writer quantizes
                p = write_family_gguf(self.hf(name, "gguf"), spec,
                                      self.root / f"{name}-{qtype}.gguf", qtype)
            self._path[key] = p
        return self._path[key]

    def sl(self, name: str, fmt: str = "st"):
        import sinklab

        key = (name, fmt)
        if key not in self._sl:
            self._sl[key] = sinklab.load(str(self.path(name, fmt)), quiet=True)
        return self._sl[key]


def canonical_param_grads(model, gguf_layout: bool = False) -> Dict[str, np.ndarray]:
    """The gradients held in `model`'s parameters (after a backward pass), keyed by the C
    core's canonical names in canonical layout: matrices (out, in) (GPT-2's Conv1D weights
    transposed and c_attn split into Q, K, V by rows), Gemma norms as the (1 + w) multiplier
    (same gradient as w), BERT's token-type row 0 as type_embd; the LM head only when untied;
    BERT's pooler (unused by the stream) left out. gguf_layout: LLaMA's Q/K rows permuted as
    llama.cpp stores them."""
    cfg = model.config
    mt = cfg.model_type
    params = dict(model.named_parameters())
    out: Dict[str, np.ndarray] = {}

    def g(name):
        p = params[name]
        return (np.zeros(tuple(p.shape), np.float32) if p.grad is None
                else p.grad.detach().cpu().numpy().astype(np.float32).copy())

    f = config_facts(cfg)
    L = f["n_layers"]
    if mt == "gpt2":
        d = f["d_model"]
        out["tok_embd"], out["pos_embd"] = g("transformer.wte.weight"), g("transformer.wpe.weight")
        out["out_norm"], out["out_norm_b"] = g("transformer.ln_f.weight"), g("transformer.ln_f.bias")
        if not cfg.tie_word_embeddings:
            out["lm_head"] = g("lm_head.weight")
        for l in range(L):
            p, b = f"transformer.h.{l}.", f"blk.{l}."
            out[b + "attn_norm"], out[b + "attn_norm_b"] = g(p + "ln_1.weight"), g(p + "ln_1.bias")
            w, bias = g(p + "attn.c_attn.weight").T, g(p + "attn.c_attn.bias")
            for i, k in enumerate(("attn_q", "attn_k", "attn_v")):
                out[b + k] = np.ascontiguousarray(w[i * d:(i + 1) * d])
                out[b + k + "_b"] = bias[i * d:(i + 1) * d].copy()
            out[b + "attn_output"] = np.ascontiguousarray(g(p + "attn.c_proj.weight").T)
            out[b + "attn_output_b"] = g(p + "attn.c_proj.bias")
            out[b + "ffn_norm"], out[b + "ffn_norm_b"] = g(p + "ln_2.weight"), g(p + "ln_2.bias")
            out[b + "ffn_up"] = np.ascontiguousarray(g(p + "mlp.c_fc.weight").T)
            out[b + "ffn_up_b"] = g(p + "mlp.c_fc.bias")
            out[b + "ffn_down"] = np.ascontiguousarray(g(p + "mlp.c_proj.weight").T)
            out[b + "ffn_down_b"] = g(p + "mlp.c_proj.bias")
        return out
    if mt == "bert":
        e = "embeddings."
        out["tok_embd"], out["pos_embd"] = g(e + "word_embeddings.weight"), g(e + "position_embeddings.weight")
        out["type_embd"] = g(e + "token_type_embeddings.weight")[0].copy()
        out["embd_norm"], out["embd_norm_b"] = g(e + "LayerNorm.weight"), g(e + "LayerNorm.bias")
        for l in range(L):
            p, b = f"encoder.layer.{l}.", f"blk.{l}."
            for hf_name, k in (("attention.self.query", "attn_q"), ("attention.self.key", "attn_k"),
                               ("attention.self.value", "attn_v"), ("attention.output.dense", "attn_output"),
                               ("attention.output.LayerNorm", "attn_res_norm"),
                               ("intermediate.dense", "ffn_up"), ("output.dense", "ffn_down"),
                               ("output.LayerNorm", "ffn_res_norm")):
                out[b + k], out[b + k + "_b"] = g(p + hf_name + ".weight"), g(p + hf_name + ".bias")
        return out
    # RoPE decoders
    out["tok_embd"], out["out_norm"] = g("model.embed_tokens.weight"), g("model.norm.weight")
    if not cfg.tie_word_embeddings:
        out["lm_head"] = g("lm_head.weight")
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    if mt in ("gemma2", "gemma3_text"):
        names.update({"post_attention_layernorm": "attn_post_norm", "pre_feedforward_layernorm": "ffn_norm",
                      "post_feedforward_layernorm": "ffn_post_norm"})
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    H, G = f["n_heads"], f["n_kv_heads"]
    for l in range(L):
        for hf_name, k in names.items():
            for suffix, tail in (("weight", ""), ("bias", "_b")):
                name = f"model.layers.{l}.{hf_name}.{suffix}"
                if name not in params:
                    continue
                a = g(name)
                if gguf_layout and mt == "llama" and k in ("attn_q", "attn_k"):
                    a = llama_cpp_permute(a, H, H if k == "attn_q" else G)
                out[f"blk.{l}.{k}{tail}"] = np.ascontiguousarray(a)
    return out


@contextlib.contextmanager
def torch_single_thread():
    """torch on one thread for the tiny reference models (restored after): their ops are far
    too small to gain from threads, and on a shared machine OpenMP's waiting threads slow each
    op by orders of magnitude (40 ms instead of 0.1 ms for a 40x64 @ 64x64 linear)."""
    torch = require("torch")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
