"""The LLaMA family (LLaMA 1–3, SmolLM2, TinyLlama, Mistral): its tensor names in Hugging Face
safetensors and GGUF files, and its config.

Canonical names are what the C core reads (``tok_embd``, ``blk.N.attn_q``, …; numpy order
(out, in); see :mod:`sinklab.families.base`). A family module states: the HF ``model_type``\\ s
and GGUF architectures it reads (``HF_TYPES``, ``GGUF_ARCHS``), ``config_from_hf``,
``config_from_gguf``, ``weights(cfg, src)`` and ``rope_layout(fmt)``. The tables here are the
LLaMA-style decoder naming that Qwen and Gemma reuse.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Dict, Mapping, Optional

from . import base
from .config import ModelConfig

NAME = "llama"
HF_TYPES = ("llama", "mistral")
GGUF_ARCHS = ("llama",)
ARCHS = HF_TYPES  # kept for callers of the LLaMA-only loader

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
# Optional per-layer tensors of LLaMA-style decoders (biases: attention_bias / mlp_bias, Qwen2;
# QK-norm: Qwen3, Gemma 3).
OPTIONAL_LAYER_NAMES = {
    "attn_q_b": ("model.layers.{l}.self_attn.q_proj.bias", "blk.{l}.attn_q.bias"),
    "attn_k_b": ("model.layers.{l}.self_attn.k_proj.bias", "blk.{l}.attn_k.bias"),
    "attn_v_b": ("model.layers.{l}.self_attn.v_proj.bias", "blk.{l}.attn_v.bias"),
    "attn_output_b": ("model.layers.{l}.self_attn.o_proj.bias", "blk.{l}.attn_output.bias"),
    "ffn_gate_b": ("model.layers.{l}.mlp.gate_proj.bias", "blk.{l}.ffn_gate.bias"),
    "ffn_up_b": ("model.layers.{l}.mlp.up_proj.bias", "blk.{l}.ffn_up.bias"),
    "ffn_down_b": ("model.layers.{l}.mlp.down_proj.bias", "blk.{l}.ffn_down.bias"),
    "attn_q_norm": ("model.layers.{l}.self_attn.q_norm.weight", "blk.{l}.attn_q_norm.weight"),
    "attn_k_norm": ("model.layers.{l}.self_attn.k_norm.weight", "blk.{l}.attn_k_norm.weight"),
    # attention variants (ModelConfig.attn_variant): gpt-oss's name for the sink logits; the gate's W_g
    "attn_sinks": ("model.layers.{l}.self_attn.sinks", "blk.{l}.attn_sinks.weight"),
    "attn_gate": ("model.layers.{l}.self_attn.gate_proj.weight", "blk.{l}.attn_gate.weight")}
_FORMATS = ("hf", "gguf")
ATTN_BIASES = ("attn_q_b", "attn_k_b", "attn_v_b", "attn_output_b")
MLP_BIASES = ("ffn_gate_b", "ffn_up_b", "ffn_down_b")


def layer_shapes(cfg: ModelConfig):
    """Shape of each per-layer tensor, numpy order (out, in)."""
    return base.layer_shapes(cfg)


def global_shapes(cfg: ModelConfig):
    """Shape of the embedding, final norm and LM head."""
    return base.global_shapes(cfg)


def file_name(key: str, fmt: str, layer: Optional[int] = None) -> str:
    """The name a file of format ``fmt`` ("hf" or "gguf") gives canonical tensor ``key``
    (of ``layer`` for per-layer tensors)."""
    i = _FORMATS.index(fmt)
    if layer is None:
        return GLOBAL_NAMES[key][i]
    return {**LAYER_NAMES, **OPTIONAL_LAYER_NAMES}[key][i].format(l=layer)


def decoder_names(fmt: str, global_names: Mapping[str, tuple] = GLOBAL_NAMES,
                  layer_names: Optional[Mapping[str, tuple]] = None) -> Callable[[str], str]:
    """``name_of`` for :func:`base.assemble` over (HF, GGUF) name-pair tables."""
    i = _FORMATS.index(fmt)
    layer_names = {**LAYER_NAMES, **OPTIONAL_LAYER_NAMES} if layer_names is None else layer_names
    return base.table_names({k: v[i] for k, v in global_names.items()},
                            {k: v[i] for k, v in layer_names.items()})


def gguf_biases(meta: Any) -> tuple:
    """The per-layer biases a GGUF file carries (looked up on layer 0)."""
    return tuple(k for k in ATTN_BIASES + MLP_BIASES if OPTIONAL_LAYER_NAMES[k][1].format(l=0) in meta.tensor_names)


def config_from_hf(c: Dict[str, Any], path: str) -> ModelConfig:
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: hidden_act={act!r} is not supported (LLaMA uses silu)")
    kw = base.hf_common(c, path, NAME)
    biases = (ATTN_BIASES if c.get("attention_bias") else ()) + (MLP_BIASES if c.get("mlp_bias") else ())
    window = None
    if c["model_type"] == "mistral" and c.get("sliding_window"):
        window = (int(c["sliding_window"]),) * kw["n_layers"]  # every Mistral layer slides
    # sinklab's own checkpoints of an attention variant (sinklab.train.checkpoint) say so here;
    # transformers' LLaMA would ignore the sink or gate tensors, so nothing else names it
    variant = c.get("sinklab_attn_variant", "softmax")
    return ModelConfig(**kw, biases=biases, window=window, attn_variant=variant)


def config_from_gguf(meta: Any) -> ModelConfig:
    kw = base.gguf_common(meta, NAME)
    kw["norm_eps"] = float(meta.get(meta.arch + ".attention.layer_norm_rms_epsilon"))
    scaling = base.gguf_rope_checks(meta, kw["head_dim"])
    w = meta.get(meta.arch + ".attention.sliding_window", None)
    window = (int(w),) * kw["n_layers"] if w else None
    return ModelConfig(**kw, rope_scaling=scaling, biases=gguf_biases(meta), window=window)


def weights(cfg: ModelConfig, src: Any) -> Dict[str, Any]:
    return base.assemble(cfg, src, decoder_names(src.fmt))


def rope_layout(fmt: str) -> int:
    """llama.cpp permutes LLaMA's Q/K rows into adjacent RoPE pairs (1); HF keeps half-split (0)."""
    return 1 if fmt == "gguf" else 0


def canonical_weights(cfg: ModelConfig, fmt: str, get: Callable[..., Any]) -> Dict[str, Any]:
    """Every canonical tensor, fetched with ``get(file_name, shape)``; the LM head is the
    embedding when ``cfg.tied_embeddings`` (kept for callers of the LLaMA-only loader)."""
    return base.assemble(cfg, SimpleNamespace(fmt=fmt, get=get), decoder_names(fmt))
