"""The Gemma family: Gemma 1, Gemma 2 and Gemma 3 (text).

Common to all: GeGLU MLP with tanh-GELU, the embedding scaled by float32(sqrt(d)), RMSNorm
multipliers stored as w and applied as 1 + w (Hugging Face files store w and the loader adds 1
in float32; llama.cpp's converter already stored 1 + w in GGUF files), tied embeddings.
Gemma 2 adds post-attention and post-MLP norms, attention and final logit soft-capping,
sliding-window attention on even layers, and the attention scale query_pre_attn_scalar**-0.5.
Gemma 3 drops the soft-caps, adds per-head QK-norm, slides on 5 of every 6 layers, and uses RoPE
base 10000 on sliding layers, ``rope_theta`` (with its scaling) on full ones. GGUF Q/K rows are
not permuted (NEOX RoPE): half-split layout in both formats.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import base, llama
from .config import ModelConfig

NAME = "gemma"
HF_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")
GGUF_ARCHS = ("gemma", "gemma2", "gemma3")
_TANH_GELU = ("gelu_pytorch_tanh",)
LOCAL_ROPE_THETA = 10000.0   # llama.cpp's and transformers' Gemma 3 default for sliding layers
GLOBAL_ROPE_THETA = 1_000_000.0
# llama.cpp's layer patterns: layer l slides iff l % n < n - 1
SWA_PATTERN = {"gemma2": 2, "gemma3": 6}

# Gemma 2/3 names where they differ from LLaMA's (post_attention_layernorm is the attention
# output's norm here, not the MLP's input norm).
_POST_NORM_NAMES = {
    "attn_post_norm": ("model.layers.{l}.post_attention_layernorm.weight", "blk.{l}.post_attention_norm.weight"),
    "ffn_norm": ("model.layers.{l}.pre_feedforward_layernorm.weight", "blk.{l}.ffn_norm.weight"),
    "ffn_post_norm": ("model.layers.{l}.post_feedforward_layernorm.weight", "blk.{l}.post_ffw_norm.weight")}
# Gemma 3 saved inside Gemma3ForConditionalGeneration (transformers 4 and 5 layouts).
_HF_ALIASES = (("model.", "model.language_model."), ("model.", "language_model.model."),
               ("lm_head.", "language_model.lm_head."))


def _pattern_windows(n_layers: int, window: int, n: int) -> Optional[Tuple[int, ...]]:
    return tuple(window if l % n < n - 1 else 0 for l in range(n_layers)) if window else None


def _norms(kind: str) -> Tuple[str, ...]:
    if kind == "gemma":
        return ("attn_norm", "ffn_norm")
    qk = ("attn_q_norm", "attn_k_norm") if kind == "gemma3" else ()
    return ("attn_norm",) + qk + ("attn_post_norm", "ffn_norm", "ffn_post_norm")


def config_from_hf(c: Dict[str, Any], path: str) -> ModelConfig:
    if c.get("model_type") == "gemma3":  # multimodal wrapper: the language model's config
        if not isinstance(c.get("text_config"), dict):
            raise KeyError(f"{path}: a gemma3 config needs its text_config")
        c = dict(c["text_config"], model_type="gemma3")
    kind = {"gemma3_text": "gemma3"}.get(c["model_type"], c["model_type"])
    act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
    if kind == "gemma" and act == "gelu":  # legacy Gemma 1 value, meant as the tanh form (transformers does the same)
        act = "gelu_pytorch_tanh"
    if act not in _TANH_GELU:
        raise ValueError(f"{path}: hidden activation {act!r} is not supported for Gemma (supported: gelu_pytorch_tanh)")
    if c.get("use_bidirectional_attention"):
        raise ValueError(f"{path}: use_bidirectional_attention=true (EmbeddingGemma) is not supported")
    if c.get("attention_bias"):
        raise ValueError(f"{path}: attention_bias=true is not supported for Gemma")
    kw = base.hf_common(c, path, NAME)
    kw["tied_embeddings"] = bool(c.get("tie_word_embeddings", True))
    extra: Dict[str, Any] = dict(act="geglu_tanh", embd_scale=base.float32_sqrt(kw["d_model"]),
                                 layer_norms=_norms(kind))
    L = kw["n_layers"]
    if kind in ("gemma2", "gemma3"):
        if c.get("query_pre_attn_scalar") is not None:
            extra["attn_scale"] = float(c["query_pre_attn_scalar"]) ** -0.5
        extra["attn_softcap"] = float(c.get("attn_logit_softcapping") or 0.0)
        extra["final_softcap"] = float(c.get("final_logit_softcapping") or 0.0)
        if c.get("layer_types") is not None:
            extra["window"] = base.hf_layer_windows(c, L, path)
        else:
            n = int(c.get("sliding_window_pattern") or SWA_PATTERN[kind])
            extra["window"] = _pattern_windows(L, int(c.get("sliding_window") or 0), n)
    if kind == "gemma3":
        params = c.get("rope_parameters") or {}
        if "full_attention" in params or "sliding_attention" in params:  # transformers 5
            full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
            kw["rope_theta"] = float(full.get("rope_theta", GLOBAL_ROPE_THETA))
            kw["rope_scaling"] = base.rope_scaling_dict(full)
            extra["rope_local_theta"] = float(local.get("rope_theta", LOCAL_ROPE_THETA))
            extra["rope_local_scaling"] = base.rope_scaling_dict(local)
        else:  # transformers 4: rope_theta / rope_scaling are the full layers', rope_local_base_freq the sliding ones'
            kw["rope_theta"] = float(c.get("rope_theta") or GLOBAL_ROPE_THETA)
            extra["rope_local_theta"] = float(c.get("rope_local_base_freq") or LOCAL_ROPE_THETA)
    return ModelConfig(**kw, **extra)


def config_from_gguf(meta: Any) -> ModelConfig:
    arch, p = meta.arch, meta.arch + "."
    kw = base.gguf_common(meta, NAME)
    kw["norm_eps"] = float(meta.get(p + "attention.layer_norm_rms_epsilon"))
    kw["rope_scaling"] = base.gguf_rope_checks(meta, kw["head_dim"])
    L = kw["n_layers"]
    extra: Dict[str, Any] = dict(act="geglu_tanh", embd_scale=base.float32_sqrt(kw["d_model"]),
                                 layer_norms=_norms(arch))
    if arch in ("gemma2", "gemma3"):
        extra["attn_softcap"] = float(meta.get(p + "attn_logit_softcapping", 0.0) or 0.0)
        extra["final_softcap"] = float(meta.get(p + "final_logit_softcapping", 0.0) or 0.0)
        # llama.cpp: the 27B models scale by 1/sqrt(d/H) (query_pre_attn_scalar), others 1/sqrt(head_dim)
        if L == {"gemma2": 46, "gemma3": 62}[arch]:
            extra["attn_scale"] = (kw["d_model"] // kw["n_heads"]) ** -0.5
        window = int(meta.get(p + "attention.sliding_window", 0) or 0)
        pattern = meta.get(p + "attention.sliding_window_pattern", SWA_PATTERN[arch])
        if isinstance(pattern, (list, tuple)):  # per-layer flags: true = sliding
            if len(pattern) != L:
                raise ValueError(f"{p}attention.sliding_window_pattern has {len(pattern)} entries for {L} layers")
            extra["window"] = tuple(window if bool(s) else 0 for s in pattern) if window else None
        else:
            extra["window"] = _pattern_windows(L, window, int(pattern))
    if arch == "gemma3":
        extra["rope_local_theta"] = float(meta.get(p + "rope.freq_base_swa", LOCAL_ROPE_THETA))
    return ModelConfig(**kw, **extra)


def weights(cfg: ModelConfig, src: Any) -> Dict[str, Any]:
    layer_names = {**llama.LAYER_NAMES, **llama.OPTIONAL_LAYER_NAMES}
    if "attn_post_norm" in cfg.layer_norms:
        layer_names.update(_POST_NORM_NAMES)
    names = llama.decoder_names(src.fmt, layer_names=layer_names)
    if src.fmt == "hf":
        resolve = base.with_aliases(src.names, _HF_ALIASES)
        return base.assemble(cfg, src, lambda k: resolve(names(k)), norm_plus_one=True)
    return base.assemble(cfg, src, names)  # GGUF files store 1 + w already


def rope_layout(fmt: str) -> int:
    return 0
