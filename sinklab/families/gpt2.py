"""GPT-2: LayerNorm with biases, learned absolute positions, a plain GELU MLP (tanh form,
``gelu_new``), biases on every projection, tied embeddings, no RoPE.

Hugging Face stores the projections as ``Conv1D`` weights of shape (in, out), transposed here
into the canonical (out, in), and Q, K, V fused in one ``c_attn`` matrix, split here by rows.
llama.cpp's converter already transposed them; its ``attn_qkv`` is split the same way (for
quantized files without decoding: the rows of a block-quantized matrix are whole blocks)."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from . import base
from .config import ModelConfig
from .tensors import split_rows, to_f32

NAME = "gpt2"
HF_TYPES = ("gpt2",)
GGUF_ARCHS = ("gpt2",)
_ACTS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_BIASES = ("attn_q_b", "attn_k_b", "attn_v_b", "attn_output_b", "ffn_up_b", "ffn_down_b")
_NORMS = ("attn_norm", "ffn_norm")

HF_LAYER = {"attn_norm": "h.{l}.ln_1.weight", "attn_norm_b": "h.{l}.ln_1.bias",
            "attn_output": "h.{l}.attn.c_proj.weight", "attn_output_b": "h.{l}.attn.c_proj.bias",
            "ffn_norm": "h.{l}.ln_2.weight", "ffn_norm_b": "h.{l}.ln_2.bias",
            "ffn_up": "h.{l}.mlp.c_fc.weight", "ffn_up_b": "h.{l}.mlp.c_fc.bias",
            "ffn_down": "h.{l}.mlp.c_proj.weight", "ffn_down_b": "h.{l}.mlp.c_proj.bias"}
HF_GLOBAL = {"tok_embd": "wte.weight", "pos_embd": "wpe.weight", "out_norm": "ln_f.weight",
             "out_norm_b": "ln_f.bias", "lm_head": "lm_head.weight"}
GGUF_LAYER = {"attn_norm": "blk.{l}.attn_norm.weight", "attn_norm_b": "blk.{l}.attn_norm.bias",
              "attn_output": "blk.{l}.attn_output.weight", "attn_output_b": "blk.{l}.attn_output.bias",
              "ffn_norm": "blk.{l}.ffn_norm.weight", "ffn_norm_b": "blk.{l}.ffn_norm.bias",
              "ffn_up": "blk.{l}.ffn_up.weight", "ffn_up_b": "blk.{l}.ffn_up.bias",
              "ffn_down": "blk.{l}.ffn_down.weight", "ffn_down_b": "blk.{l}.ffn_down.bias"}
GGUF_GLOBAL = {"tok_embd": "token_embd.weight", "pos_embd": "position_embd.weight",
               "out_norm": "output_norm.weight", "out_norm_b": "output_norm.bias", "lm_head": "output.weight"}
_CONV1D = ("attn_output", "ffn_up", "ffn_down")  # HF Conv1D weights, (in, out) in the file


def _config(arch: str, L: int, H: int, d: int, F: int, V: int, n_pos: int, eps: float, act: str,
            tied: bool, bos, eos, attn_scale=None) -> ModelConfig:
    return ModelConfig(arch=arch, family=NAME, n_layers=L, n_heads=H, n_kv_heads=H, d_model=d,
                       head_dim=d // H, d_ff=F, vocab_size=V, context_length=n_pos, rope_theta=10000.0,
                       norm_eps=eps, tied_embeddings=tied, bos_token_id=bos, eos_token_id=eos,
                       norm_kind="layernorm", act=act, positions="learned", n_pos=n_pos,
                       layer_norms=_NORMS, biases=_BIASES, attn_scale=attn_scale)


def config_from_hf(c: Dict[str, Any], path: str) -> ModelConfig:
    need = base.hf_need(c, path)
    act = c.get("activation_function", "gelu_new")
    if act not in _ACTS:
        raise ValueError(f"{path}: activation_function={act!r} is not supported (supported: {', '.join(_ACTS)})")
    if c.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError(f"{path}: scale_attn_by_inverse_layer_idx=true is not supported")
    d, H = int(need("n_embd")), int(need("n_head"))
    if d % H:
        raise ValueError(f"{path}: n_embd={d} is not a multiple of n_head={H}")
    bos, eos = c.get("bos_token_id"), c.get("eos_token_id")
    return _config(c["model_type"], int(need("n_layer")), H, d, int(c.get("n_inner") or 4 * d),
                   int(need("vocab_size")), int(need("n_positions")), float(c.get("layer_norm_epsilon", 1e-5)),
                   _ACTS[act], bool(c.get("tie_word_embeddings", True)),
                   None if bos is None else int(bos), None if eos is None else int(eos),
                   attn_scale=None if c.get("scale_attn_weights", True) else 1.0)


def config_from_gguf(meta: Any) -> ModelConfig:
    p = meta.arch + "."
    d, H = int(meta.get(p + "embedding_length")), int(meta.get(p + "attention.head_count"))
    embd = meta.tensor_shape("token_embd.weight")
    bos, eos = meta.get("tokenizer.ggml.bos_token_id", None), meta.get("tokenizer.ggml.eos_token_id", None)
    return _config(meta.arch, int(meta.get(p + "block_count")), H, d, int(meta.get(p + "feed_forward_length")),
                   int(embd[0]), int(meta.get(p + "context_length")),
                   float(meta.get(p + "attention.layer_norm_epsilon")), "gelu_tanh",
                   "output.weight" not in meta.tensor_names,
                   None if bos is None else int(bos), None if eos is None else int(eos))


def weights(cfg: ModelConfig, src: Any) -> Dict[str, Any]:
    d = cfg.d_model
    hf = src.fmt == "hf"
    layer, glob = (HF_LAYER, HF_GLOBAL) if hf else (GGUF_LAYER, GGUF_GLOBAL)
    resolve = base.with_aliases(src.names, (("", "transformer."),)) if hf else (lambda n: n)
    names = base.table_names(glob, layer)
    fused: Dict[int, Dict[str, Any]] = {}

    def qkv(l: int, key: str):
        """Layer l's fused Q/K/V matrix and bias, split once into the three canonical pieces."""
        if l not in fused:
            if hf:
                w = to_f32(src.get(resolve(f"h.{l}.attn.c_attn.weight"), (d, 3 * d))).T  # (in, out) -> (out, in)
                b = to_f32(src.get(resolve(f"h.{l}.attn.c_attn.bias"), (3 * d,)))
            else:
                w = src.get(f"blk.{l}.attn_qkv.weight", (3 * d, d))
                b = to_f32(src.get(f"blk.{l}.attn_qkv.bias", (3 * d,)))
            parts = split_rows(w, (d, d, d)) + split_rows(b, (d, d, d))
            fused[l] = dict(zip(("attn_q", "attn_k", "attn_v", "attn_q_b", "attn_k_b", "attn_v_b"), parts))
        return fused[l][key]

    def name_of(key: str):
        if key.startswith("blk."):
            _, l, sub = key.split(".", 2)
            if sub in ("attn_q", "attn_k", "attn_v", "attn_q_b", "attn_k_b", "attn_v_b"):
                return lambda: qkv(int(l), sub)
            if hf and sub in _CONV1D:
                shape = base.layer_shapes(cfg)[sub]
                return lambda: np.ascontiguousarray(to_f32(src.get(resolve(names(key)), shape[::-1])).T)
        return resolve(names(key))

    return base.assemble(cfg, src, name_of)


def rope_layout(fmt: str) -> int:
    return 0  # no RoPE
