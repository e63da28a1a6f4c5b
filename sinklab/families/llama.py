"""The LLaMA family (LLaMA 1–3, SmolLM2, TinyLlama, …): its canonical tensor schema and the names
that Hugging Face safetensors and GGUF files give each tensor.

The canonical names are what the C core reads (``tok_embd``, ``blk.N.attn_q``, …; numpy order
(out, in)). Loaders in :mod:`sinklab.io` only read files and look tensors up through this
module, so a new family is a new module here with the same three things: the architecture
names it accepts, the shapes of its tensors given a :class:`ModelConfig`, and the two name maps.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from .config import ModelConfig

ARCHS = ("llama",)  # GGUF general.architecture and HF config.json model_type

# canonical key -> (Hugging Face name, GGUF name); per-layer names take the layer index.
GLOBAL_NAMES = {"tok_embd": ("model.embed_tokens.weight", "token_embd.weight"),
                "out_norm": ("model.norm.weight", "output_norm.weight"),
                "lm_head": ("lm_head.weight", "output.weight")}
LAYER_NAMES = {"attn_norm": ("model.layers.{l}.input_layernorm.weight", "blk.{l}.attn_norm.weight"),
               "attn_q": ("model.layers.{l}.self_attn.q_proj.weight", "blk.{l}.attn_q.weight"),
               "attn_k": ("model.layers.{l}.self_attn.k_proj.weight", "blk.{l}.attn_k.weight"),
               "attn_v": ("model.layers.{l}.self_attn.v_proj.weight", "blk.{l}.attn_v.weight"),
               "attn_output": ("model.layers.{l}.self_attn.o_proj.weight", "blk.{l}.attn_output.weight"),
               "ffn_norm": ("model.layers.{l}.post_attention_layernorm.weight", "blk.{l}.ffn_norm.weight"),
               "ffn_gate": ("model.layers.{l}.mlp.gate_proj.weight", "blk.{l}.ffn_gate.weight"),
               "ffn_up": ("model.layers.{l}.mlp.up_proj.weight", "blk.{l}.ffn_up.weight"),
               "ffn_down": ("model.layers.{l}.mlp.down_proj.weight", "blk.{l}.ffn_down.weight")}
LAYER_TENSORS = tuple(LAYER_NAMES)
_FORMATS = ("hf", "gguf")


def layer_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Shape of each per-layer tensor, numpy order (out, in)."""
    d, hd, F = cfg.d_model, cfg.head_dim, cfg.d_ff
    qd, kvd = cfg.n_heads * hd, cfg.n_kv_heads * hd
    return {"attn_norm": (d,), "attn_q": (qd, d), "attn_k": (kvd, d), "attn_v": (kvd, d),
            "attn_output": (d, qd), "ffn_norm": (d,), "ffn_gate": (F, d), "ffn_up": (F, d),
            "ffn_down": (d, F)}


def global_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Shape of the embedding, final norm and LM head."""
    return {"tok_embd": (cfg.vocab_size, cfg.d_model), "out_norm": (cfg.d_model,),
            "lm_head": (cfg.vocab_size, cfg.d_model)}


def file_name(key: str, fmt: str, layer: Optional[int] = None) -> str:
    """The name a file of format ``fmt`` ("hf" or "gguf") gives canonical tensor ``key``
    (of ``layer`` for per-layer tensors)."""
    i = _FORMATS.index(fmt)
    if layer is None:
        return GLOBAL_NAMES[key][i]
    return LAYER_NAMES[key][i].format(l=layer)


def canonical_weights(cfg: ModelConfig, fmt: str, get) -> Dict[str, "object"]:
    """Every canonical tensor, fetched with ``get(file_name, shape)`` (the loader's reader);
    the LM head is the embedding when ``cfg.tied_embeddings``."""
    g = global_shapes(cfg)
    out = {k: get(file_name(k, fmt), g[k]) for k in ("tok_embd", "out_norm")}
    out["lm_head"] = out["tok_embd"] if cfg.tied_embeddings else get(file_name("lm_head", fmt), g["lm_head"])
    shapes = layer_shapes(cfg)
    for l in range(cfg.n_layers):
        for key in LAYER_TENSORS:
            out[f"blk.{l}.{key}"] = get(file_name(key, fmt, l), shapes[key])
    return out
