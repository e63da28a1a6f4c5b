"""BERT encoders (all-MiniLM-L6-v2, bert-base, …): bidirectional attention, learned absolute
positions plus the token-type-0 embedding, LayerNorm after the embedding sum and post-LN blocks
(``attn_res_norm``/``ffn_res_norm`` after each residual add), exact-erf GELU MLP, biases on
every projection, no LM head (no logits). The pooler is not read.

Hugging Face names with or without the ``bert.`` prefix (sentence-transformers saves a bare
BertModel); GGUF names as llama.cpp's converter writes them (separate or fused QKV)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

from . import base
from .config import ModelConfig
from .tensors import split_rows, to_f32

NAME = "bert"
HF_TYPES = ("bert",)
GGUF_ARCHS = ("bert",)
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_BIASES = ("attn_q_b", "attn_k_b", "attn_v_b", "attn_output_b", "ffn_up_b", "ffn_down_b")
_NORMS = ("attn_res_norm", "ffn_res_norm")

_E = "embeddings."
_A = "encoder.layer.{l}.attention."
HF_GLOBAL = {"tok_embd": _E + "word_embeddings.weight", "pos_embd": _E + "position_embeddings.weight",
             "embd_norm": _E + "LayerNorm.weight", "embd_norm_b": _E + "LayerNorm.bias"}
HF_LAYER = {"attn_q": _A + "self.query.weight", "attn_q_b": _A + "self.query.bias",
            "attn_k": _A + "self.key.weight", "attn_k_b": _A + "self.key.bias",
            "attn_v": _A + "self.value.weight", "attn_v_b": _A + "self.value.bias",
            "attn_output": _A + "output.dense.weight", "attn_output_b": _A + "output.dense.bias",
            "attn_res_norm": _A + "output.LayerNorm.weight", "attn_res_norm_b": _A + "output.LayerNorm.bias",
            "ffn_up": "encoder.layer.{l}.intermediate.dense.weight", "ffn_up_b": "encoder.layer.{l}.intermediate.dense.bias",
            "ffn_down": "encoder.layer.{l}.output.dense.weight", "ffn_down_b": "encoder.layer.{l}.output.dense.bias",
            "ffn_res_norm": "encoder.layer.{l}.output.LayerNorm.weight",
            "ffn_res_norm_b": "encoder.layer.{l}.output.LayerNorm.bias"}
HF_TYPE_EMBD = _E + "token_type_embeddings.weight"
GGUF_GLOBAL = {"tok_embd": "token_embd.weight", "pos_embd": "position_embd.weight",
               "embd_norm": "token_embd_norm.weight", "embd_norm_b": "token_embd_norm.bias"}
GGUF_LAYER = {"attn_q": "blk.{l}.attn_q.weight", "attn_q_b": "blk.{l}.attn_q.bias",
              "attn_k": "blk.{l}.attn_k.weight", "attn_k_b": "blk.{l}.attn_k.bias",
              "attn_v": "blk.{l}.attn_v.weight", "attn_v_b": "blk.{l}.attn_v.bias",
              "attn_output": "blk.{l}.attn_output.weight", "attn_output_b": "blk.{l}.attn_output.bias",
              "attn_res_norm": "blk.{l}.attn_output_norm.weight", "attn_res_norm_b": "blk.{l}.attn_output_norm.bias",
              "ffn_up": "blk.{l}.ffn_up.weight", "ffn_up_b": "blk.{l}.ffn_up.bias",
              "ffn_down": "blk.{l}.ffn_down.weight", "ffn_down_b": "blk.{l}.ffn_down.bias",
              "ffn_res_norm": "blk.{l}.layer_output_norm.weight", "ffn_res_norm_b": "blk.{l}.layer_output_norm.bias"}
GGUF_TYPE_EMBD = "token_types.weight"


def _config(arch: str, L: int, H: int, d: int, F: int, V: int, n_pos: int, eps: float, act: str,
            bos: Optional[int], eos: Optional[int]) -> ModelConfig:
    return ModelConfig(arch=arch, family=NAME, n_layers=L, n_heads=H, n_kv_heads=H, d_model=d,
                       head_dim=d // H, d_ff=F, vocab_size=V, context_length=n_pos, rope_theta=10000.0,
                       norm_eps=eps, tied_embeddings=False, bos_token_id=bos, eos_token_id=eos,
                       norm_kind="layernorm", act=act, bidirectional=True, positions="learned", n_pos=n_pos,
                       has_lm_head=False, has_out_norm=False, embd_norm=True, type_embd=True,
                       layer_norms=_NORMS, biases=_BIASES)


def _cls_sep(folder: str) -> Tuple[Optional[int], Optional[int]]:
    """[CLS] and [SEP] ids from tokenizer.json's post-processor: BERT's first and last tokens
    (config.json names neither)."""
    path = os.path.join(folder, "tokenizer.json")
    try:
        with open(path) as f:
            special = (json.load(f).get("post_processor") or {}).get("special_tokens") or {}
    except (OSError, ValueError):
        return None, None
    ids = lambda name: (special.get(name) or {}).get("ids") or [None]  # noqa: E731
    return ids("[CLS]")[0], ids("[SEP]")[0]


def config_from_hf(c: Dict[str, Any], path: str) -> ModelConfig:
    need = base.hf_need(c, path)
    act = c.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise ValueError(f"{path}: hidden_act={act!r} is not supported for BERT (supported: {', '.join(_ACTS)})")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{path}: position_embedding_type={c['position_embedding_type']!r} is not supported (absolute only)")
    if c.get("is_decoder"):
        raise ValueError(f"{path}: BERT as a decoder (is_decoder=true) is not supported")
    d, H = int(need("hidden_size")), int(need("num_attention_heads"))
    if d % H:
        raise ValueError(f"{path}: hidden_size={d} is not a multiple of num_attention_heads={H}")
    bos, eos = c.get("bos_token_id"), c.get("eos_token_id")
    if bos is None:
        bos, eos = _cls_sep(os.path.dirname(path))
    return _config(c["model_type"], int(need("num_hidden_layers")), H, d, int(need("intermediate_size")),
                   int(need("vocab_size")), int(need("max_position_embeddings")),
                   float(c.get("layer_norm_eps", 1e-12)), _ACTS[act], bos, eos)


def config_from_gguf(meta: Any) -> ModelConfig:
    p = meta.arch + "."
    if meta.get(p + "attention.causal", False):
        raise ValueError("a causal BERT GGUF is not supported")
    d, H = int(meta.get(p + "embedding_length")), int(meta.get(p + "attention.head_count"))
    embd = meta.tensor_shape("token_embd.weight")
    bos = meta.get("tokenizer.ggml.cls_token_id", meta.get("tokenizer.ggml.bos_token_id", None))
    eos = meta.get("tokenizer.ggml.seperator_token_id", meta.get("tokenizer.ggml.eos_token_id", None))
    return _config(meta.arch, int(meta.get(p + "block_count")), H, d, int(meta.get(p + "feed_forward_length")),
                   int(embd[0]), int(meta.get(p + "context_length")),
                   float(meta.get(p + "attention.layer_norm_epsilon")), "gelu",
                   None if bos is None else int(bos), None if eos is None else int(eos))


def weights(cfg: ModelConfig, src: Any) -> Dict[str, Any]:
    d = cfg.d_model
    hf = src.fmt == "hf"
    layer, glob, type_name = (HF_LAYER, HF_GLOBAL, HF_TYPE_EMBD) if hf else (GGUF_LAYER, GGUF_GLOBAL, GGUF_TYPE_EMBD)
    resolve = base.with_aliases(src.names, (("", "bert."),)) if hf else (lambda n: n)
    names = base.table_names(glob, layer)

    def type_embd():
        """Row 0 of the token-type table: every token of a single-segment input has type 0."""
        name = resolve(type_name)
        rows = src.shape(name)[0] if name in src.names else 2
        return to_f32(src.get(name, (rows, d)))[0].copy()

    fused: Dict[int, Dict[str, Any]] = {}

    def qkv(l: int, key: str):
        if l not in fused:  # newer llama.cpp converters fuse BERT's Q, K, V
            w = src.get(f"blk.{l}.attn_qkv.weight", (3 * d, d))
            b = to_f32(src.get(f"blk.{l}.attn_qkv.bias", (3 * d,)))
            fused[l] = dict(zip(("attn_q", "attn_k", "attn_v", "attn_q_b", "attn_k_b", "attn_v_b"),
                                split_rows(w, (d, d, d)) + split_rows(b, (d, d, d))))
        return fused[l][key]

    def name_of(key: str):
        if key == "type_embd":
            return type_embd
        if not hf and key.startswith("blk."):
            _, l, sub = key.split(".", 2)
            if sub in ("attn_q", "attn_k", "attn_v", "attn_q_b", "attn_k_b", "attn_v_b") \
                    and f"blk.{l}.attn_qkv.weight" in src.names:
                return lambda: qkv(int(l), sub)
        return resolve(names(key))

    return base.assemble(cfg, src, name_of)


def rope_layout(fmt: str) -> int:
    return 0  # no RoPE
