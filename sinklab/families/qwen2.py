"""The Qwen family: Qwen2 / Qwen2.5 (biases on the Q, K, V projections) and Qwen3 (per-head
RMSNorm on queries and keys before RoPE). LLaMA-style names in both file formats; llama.cpp
converts these with NEOX RoPE, so GGUF Q/K rows are NOT permuted (half-split layout)."""
from __future__ import annotations

from typing import Any, Dict, Tuple

from . import base, llama
from .config import ModelConfig

NAME = "qwen2"
HF_TYPES = ("qwen2", "qwen3")
GGUF_ARCHS = ("qwen2", "qwen3")
QKV_BIASES = ("attn_q_b", "attn_k_b", "attn_v_b")


def _hf_windows(c: Dict[str, Any], n_layers: int, path: str):
    """Qwen2's sliding window: only with use_sliding_window, on layers >= max_window_layers
    (or as ``layer_types`` states)."""
    if not c.get("use_sliding_window") or not c.get("sliding_window"):
        return None
    if c.get("layer_types") is not None:
        return base.hf_layer_windows(c, n_layers, path)
    first = int(c.get("max_window_layers") or 0)
    return tuple(int(c["sliding_window"]) if l >= first else 0 for l in range(n_layers))


def config_from_hf(c: Dict[str, Any], path: str) -> ModelConfig:
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: hidden_act={act!r} is not supported (Qwen uses silu)")
    kw = base.hf_common(c, path, NAME)
    biases: Tuple[str, ...]
    norms: Tuple[str, ...]
    if c["model_type"] == "qwen2":
        biases = QKV_BIASES  # always on in Qwen2's attention, whatever attention_bias says
        norms = ("attn_norm", "ffn_norm")
    else:
        biases = llama.ATTN_BIASES if c.get("attention_bias") else ()
        norms = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")
    return ModelConfig(**kw, biases=biases, layer_norms=norms, window=_hf_windows(c, kw["n_layers"], path))


def config_from_gguf(meta: Any) -> ModelConfig:
    kw = base.gguf_common(meta, NAME)
    kw["norm_eps"] = float(meta.get(meta.arch + ".attention.layer_norm_rms_epsilon"))
    scaling = base.gguf_rope_checks(meta, kw["head_dim"])
    norms = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm") if meta.arch == "qwen3" else ("attn_norm", "ffn_norm")
    return ModelConfig(**kw, rope_scaling=scaling, biases=llama.gguf_biases(meta), layer_norms=norms)


def weights(cfg: ModelConfig, src: Any) -> Dict[str, Any]:
    return base.assemble(cfg, src, llama.decoder_names(src.fmt))


def rope_layout(fmt: str) -> int:
    return 0
