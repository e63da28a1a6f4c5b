"""Model configuration shared by every loader: the numbers and switches the C forward needs,
named once. The architecture is data: a family module (:mod:`sinklab.families`) fills these
fields from a file, and :meth:`ModelConfig.core_config` hands them to the C core."""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional, Tuple

NORM_KINDS = ("rmsnorm", "layernorm")
# C core act codes: 0 SwiGLU, 1 GeGLU (tanh GELU), 2 plain MLP tanh GELU (GPT-2 gelu_new),
# 3 plain MLP exact erf GELU (BERT "gelu").
ACTS = ("swiglu", "geglu_tanh", "gelu_tanh", "gelu")
GATED_ACTS = ("swiglu", "geglu_tanh")
POSITIONS = ("rope", "learned", "none")
# The attention's normaliser or gate (csrc/attention.h, in the core's order): plain softmax; a learned
# per-head sink logit in the denominator (gpt-oss); softmax-plus-one (the sink logit fixed at 0);
# softmax attention with a sigmoid output gate (Qiu et al. 2025, G1).
ATTN_VARIANTS = ("softmax", "sink_logit", "softmax1", "gated")
# Per-layer norms a family may have (canonical names, see the contract in sinklab.model).
LAYER_NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "attn_post_norm", "attn_res_norm",
               "ffn_norm", "ffn_post_norm", "ffn_res_norm")
QK_NORMS = ("attn_q_norm", "attn_k_norm")  # per head (head_dim,), always RMSNorm, no bias
LAYER_BIASES = ("attn_q_b", "attn_k_b", "attn_v_b", "attn_output_b", "ffn_gate_b", "ffn_up_b", "ffn_down_b")
# Sizes, windows and positions are C ints in the core: a config.json stating 2^62 layers or a
# 1e308 window is refused here, before anything is sized from it.
MAX_SIZE = 2 ** 31 - 1
ROPE_SCALING_TYPES = ("default", "linear", "llama3")  # what sinklab.families.rope computes
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_positive_number(v: Any) -> bool:
    """A finite real > 0 (NaN, inf, strings, lists and bools are not)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and float(v) > 0


def check_rope_scaling(scaling: Any, name: str = "rope_scaling") -> None:
    """ValueError unless ``scaling`` is None or a RoPE scaling dict sinklab computes:
    ``rope_type`` (or ``type``) default, linear with a positive ``factor``, or llama3 with
    positive ``factor``, ``low_freq_factor`` < ``high_freq_factor`` and
    ``original_max_position_embeddings``."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(f"model config {name}={scaling!r} must be a dict or None")
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if not isinstance(kind, str) or kind not in ROPE_SCALING_TYPES:
        raise ValueError(f"unsupported RoPE scaling type {kind!r} in {name} "
                         f"(supported: {', '.join(ROPE_SCALING_TYPES)})")
    need = {"default": (), "linear": ("factor",), "llama3": _LLAMA3_KEYS}[kind]
    for key in need:
        if not _is_positive_number(scaling.get(key)):
            raise ValueError(f"{kind} RoPE scaling needs a positive finite {key!r}, got {scaling.get(key)!r} in {name}")
    if kind == "llama3" and not scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError(f"llama3 RoPE scaling needs low_freq_factor < high_freq_factor, got {scaling!r} in {name}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a transformer read from a GGUF file or a Hugging Face folder.

    Attributes:
        arch: architecture name as the file states it (GGUF ``general.architecture`` or HF
            ``model_type``: ``"llama"``, ``"mistral"``, ``"qwen2"``, ``"gemma3"``, ``"bert"`` …).
        family: the :mod:`sinklab.families` module that reads it (``"llama"``, ``"qwen2"``,
            ``"gemma"``, ``"gpt2"``, ``"bert"``); defaults to ``arch``.
        n_layers, n_heads, n_kv_heads: layers L, query heads H, key/value heads G (G divides H).
        d_model: residual width d. head_dim: per-head width. d_ff: MLP hidden width.
        vocab_size: V. context_length: the longest sequence the model was trained for (tokens).
        rope_theta: RoPE base (of the full-attention layers when ``rope_local_theta`` is set).
        rope_scaling: None or a dict such as ``{"rope_type": "llama3", "factor": 8.0, ...}`` or
            ``{"rope_type": "linear", "factor": 2.0}`` (same layers as ``rope_theta``).
        rope_local_theta, rope_local_scaling: RoPE base and scaling of the sliding-window layers
            (``window[l] > 0``) when they differ from the global ones (Gemma 3: 10000, none);
            None: every layer uses ``rope_theta``/``rope_scaling``.
        norm_eps: epsilon of every norm. tied_embeddings: the LM head is the embedding matrix.
        bos_token_id, eos_token_id: special token ids (None if the file has none).
        norm_kind: ``"rmsnorm"`` or ``"layernorm"`` (LayerNorm norms carry a bias ``*_b``).
        act: MLP activation, one of ``ACTS`` (gated ones have ``ffn_gate``).
        bidirectional: every query sees every key (encoders) instead of keys j <= i.
        embd_scale: the token embedding is multiplied by this (Gemma: float32(sqrt(d))).
        attn_scale: attention logit scale; None means 1/sqrt(head_dim).
        attn_softcap, final_softcap: ``c * tanh(x / c)`` on attention logits / output logits;
            0 = none (Gemma 2).
        window: None, or one int per layer: sliding-window length (query i sees keys j with
            i - window < j <= i), 0 = full attention.
        positions: ``"rope"``, ``"learned"`` (absolute table ``pos_embd`` of ``n_pos`` rows) or
            ``"none"``. n_pos: rows of the learned table (0 otherwise).
        has_lm_head: False for encoders (no logits). has_out_norm: a final norm before the head.
        embd_norm: a norm after the embedding sum (BERT). type_embd: token-type-0 embedding is
            added to every token (BERT).
        layer_norms: the per-layer norms present (names from ``LAYER_NORMS``).
        biases: the per-layer projection biases present (names from ``LAYER_BIASES``).
        attn_variant: one of ``ATTN_VARIANTS``. ``"softmax"``: p_ij = exp(z_ij) / sum_j' exp(z_ij').
            ``"sink_logit"``: p_ij = exp(z_ij) / (exp(s_h) + sum_j' exp(z_ij')), s_h a learned
            scalar per (layer, head) (tensor ``attn_sinks`` (H,)): the sink absorbs mass but adds
            no value, so rows sum to < 1. ``"softmax1"``: the same with s_h = 0 fixed (no tensor).
            ``"gated"``: softmax attention whose output z is gated, z' = z * sigmoid(a W_gᵀ)
            before W_O, a the layer's normed input, W_g (H*hd, d) per layer (tensor
            ``attn_gate``), no bias.
    """

    arch: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope_theta: float
    norm_eps: float
    tied_embeddings: bool
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    rope_scaling: Optional[Dict[str, Any]] = field(default=None)
    family: str = ""
    norm_kind: str = "rmsnorm"
    act: str = "swiglu"
    bidirectional: bool = False
    embd_scale: float = 1.0
    attn_scale: Optional[float] = None
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    window: Optional[Tuple[int, ...]] = None
    rope_local_theta: Optional[float] = None
    rope_local_scaling: Optional[Dict[str, Any]] = field(default=None)
    positions: str = "rope"
    n_pos: int = 0
    has_lm_head: bool = True
    has_out_norm: bool = True
    embd_norm: bool = False
    type_embd: bool = False
    layer_norms: Tuple[str, ...] = ("attn_norm", "ffn_norm")
    biases: Tuple[str, ...] = ()
    attn_variant: str = "softmax"

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", self.arch)
        for name in ("n_layers", "n_heads", "n_kv_heads", "d_model", "head_dim", "d_ff",
                     "vocab_size", "context_length"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 < value <= MAX_SIZE:
                raise ValueError(f"model config {name}={value!r} must be a positive integer below 2^31")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        self._check_choice("norm_kind", NORM_KINDS)
        self._check_choice("act", ACTS)
        self._check_choice("positions", POSITIONS)
        self._check_choice("attn_variant", ATTN_VARIANTS)
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if not _is_int(self.n_pos) or not 0 <= self.n_pos <= MAX_SIZE:
            raise ValueError(f"model config n_pos={self.n_pos!r} must be an integer in [0, 2^31)")
        if self.positions == "learned" and self.n_pos <= 0:
            raise ValueError(f"learned positions need n_pos > 0, got {self.n_pos!r}")
        for name in ("norm_eps", "embd_scale", "rope_theta"):
            if not _is_positive_number(getattr(self, name)):
                raise ValueError(f"model config {name}={getattr(self, name)!r} must be a positive number")
        for name in ("attn_scale", "rope_local_theta"):
            v = getattr(self, name)
            if v is not None and not _is_positive_number(v):
                raise ValueError(f"model config {name}={v!r} must be a positive number or None")
        for name in ("attn_softcap", "final_softcap"):
            v = getattr(self, name)
            if not (v == 0 or _is_positive_number(v)):
                raise ValueError(f"model config {name}={v!r} must be >= 0 (0 = no soft-capping)")
        check_rope_scaling(self.rope_scaling, "rope_scaling")
        check_rope_scaling(self.rope_local_scaling, "rope_local_scaling")
        for name in ("bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and not _is_int(v):
                raise ValueError(f"model config {name}={v!r} must be an integer or None")
        if self.window is not None:
            w = tuple(self.window) if isinstance(self.window, (tuple, list)) else None
            if w is None or len(w) != self.n_layers or any(not _is_int(x) or not 0 <= x <= MAX_SIZE for x in w):
                raise ValueError(f"window must be {self.n_layers} ints in [0, 2^31) (one per layer, 0 = full), "
                                 f"got {self.window!r}")
            object.__setattr__(self, "window", w if any(w) else None)
        for name in ("layer_norms", "biases"):
            if not isinstance(getattr(self, name), (tuple, list)):
                raise ValueError(f"model config {name}={getattr(self, name)!r} must be a tuple of names")
        bad = [n for n in self.layer_norms if n not in LAYER_NORMS]
        if bad:
            raise ValueError(f"unknown per-layer norms {bad} (known: {', '.join(LAYER_NORMS)})")
        bad = [n for n in self.biases if n not in LAYER_BIASES]
        if bad:
            raise ValueError(f"unknown per-layer biases {bad} (known: {', '.join(LAYER_BIASES)})")
        if "ffn_gate_b" in self.biases and not self.gated:
            raise ValueError(f"ffn_gate_b given for the ungated activation {self.act!r}")
        if self.tied_embeddings and not self.has_lm_head:
            raise ValueError("tied_embeddings needs an LM head (has_lm_head=False)")
        object.__setattr__(self, "layer_norms", tuple(self.layer_norms))
        object.__setattr__(self, "biases", tuple(self.biases))

    def _check_choice(self, name: str, choices: Tuple[str, ...]) -> None:
        if getattr(self, name) not in choices:
            raise ValueError(f"model config {name}={getattr(self, name)!r} is not one of {', '.join(choices)}")

    @property
    def gated(self) -> bool:
        """The MLP has a gate projection (SwiGLU, GeGLU)."""
        return self.act in GATED_ACTS

    def layer_window(self, layer: int) -> int:
        """Sliding-window length of ``layer`` in tokens, 0 = full attention."""
        return 0 if self.window is None else self.window[layer]

    def layer_rope(self, layer: int) -> Tuple[float, Optional[Dict[str, Any]]]:
        """(RoPE base, scaling) of ``layer``: the local ones on sliding-window layers when
        ``rope_local_theta`` is set (Gemma 3), else the global ones."""
        if self.rope_local_theta is not None and self.layer_window(layer) > 0:
            return float(self.rope_local_theta), self.rope_local_scaling
        return float(self.rope_theta), self.rope_scaling

    def core_config(self, rope_layout: int) -> Dict[str, Any]:
        """The config dict of ``_core.model_new`` (the C model contract)."""
        out: Dict[str, Any] = {
            "n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model, "head_dim": self.head_dim, "d_ff": self.d_ff,
            "vocab_size": self.vocab_size, "norm_eps": float(self.norm_eps), "rope_layout": int(rope_layout),
            "norm_kind": NORM_KINDS.index(self.norm_kind), "act": ACTS.index(self.act),
            "bidirectional": bool(self.bidirectional), "embd_scale": float(self.embd_scale),
            "attn_softcap": float(self.attn_softcap), "final_softcap": float(self.final_softcap),
            "window": None if self.window is None else list(self.window),
            "attn_variant": ATTN_VARIANTS.index(self.attn_variant)}
        if self.attn_scale is not None:  # else the core's own 1/sqrt(head_dim)
            out["attn_scale"] = float(self.attn_scale)
        return out

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
