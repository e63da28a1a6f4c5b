"""What every family module shares: the canonical tensor schema (names and shapes the C core
reads, given a :class:`ModelConfig`; the table itself is the core's, ``sinklab.runtime.tensor_schema()``,
the X-macro table of csrc/model.h), the assembly of those tensors from a file through a name
map, and the config fields most decoders state the same way in config.json and GGUF metadata.

A loader (:mod:`sinklab.io`) hands a family two readers:

* a *tensor source* with ``fmt`` (``"hf"`` or ``"gguf"``), ``names`` (the file's tensor names),
  and ``get(name, shape)`` returning the tensor as a float32 array (zero-copy where the file is
  F32) or a :class:`QuantizedTensor` (GGUF blocks, F16, BF16), raising the loader's error when
  the name is missing or the shape differs;
* for GGUF, a *metadata reader* with ``arch``, ``tensor_names``, ``tensor_shape(name)`` and
  ``get(key, default)`` (raising the loader's error for a missing key without a default).
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..runtime import tensor_schema
from .config import ModelConfig
from .tensors import Tensor, to_f32

# The core's tensor schema: (scope, key, kind, shape, required, role) rows, globals in the order
# canonical_shapes lays them out; shapes are dimension names (_dim_sizes).
SCHEMA: Tuple[Tuple[str, str, str, Tuple[str, ...], bool, str], ...] = tensor_schema()
_GLOBAL = {row[1]: row for row in SCHEMA if row[0] == "global"}
_LAYER = {row[1]: row for row in SCHEMA if row[0] == "layer"}
# Matrices may stay quantized; every other tensor is float32.
MATRICES = tuple(row[1] for row in SCHEMA if row[2] == "matrix")


def base_name(key: str) -> str:
    """``"blk.3.attn_q"`` -> ``"attn_q"``; global names unchanged."""
    return key.rsplit(".", 1)[-1] if key.startswith("blk.") else key


def is_matrix(key: str) -> bool:
    return base_name(key) in MATRICES


def is_sink_logit(key: str) -> bool:
    """A learned per-head attention sink logit s_h (``attn_sinks``, the ``"sink_logit"`` variant)."""
    return base_name(key) == "attn_sinks"


def is_norm_weight(key: str) -> bool:
    """A norm's multiplier (not its bias): the tensors Gemma stores as w with 1 + w applied."""
    return base_name(key).endswith("norm")


def _dim_sizes(cfg: ModelConfig) -> Dict[str, int]:
    """The sizes of the schema's dimension names for this config."""
    hd = cfg.head_dim
    return {"d": cfg.d_model, "qd": cfg.n_heads * hd, "kvd": cfg.n_kv_heads * hd, "hd": hd,
            "F": cfg.d_ff, "V": cfg.vocab_size, "n_pos": cfg.n_pos, "H": cfg.n_heads}


def _shape(row: Tuple[Any, ...], sizes: Mapping[str, int]) -> Tuple[int, ...]:
    return tuple(sizes[n] for n in row[3])


def layer_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Shape of each per-layer tensor the config calls for, numpy order (out, in): its norms in
    ``cfg.layer_norms`` order (each followed by its bias under LayerNorm; the QK-norms have
    none), the projections in schema order, then ``cfg.biases`` in their order."""
    sizes = _dim_sizes(cfg)
    out: Dict[str, Tuple[int, ...]] = {}
    for n in cfg.layer_norms:
        out[n] = _shape(_LAYER[n], sizes)
        if cfg.norm_kind == "layernorm" and n + "_b" in _LAYER:
            out[n + "_b"] = _shape(_LAYER[n + "_b"], sizes)
    optional = {"ffn_gate": cfg.gated, "attn_gate": cfg.attn_variant == "gated"}  # the optional matrices
    for key, row in _LAYER.items():
        if row[5] == "matrix" and (row[4] or optional[key]):
            out[key] = _shape(row, sizes)
    out.update({b: _shape(_LAYER[b], sizes) for b in cfg.biases})
    if cfg.attn_variant == "sink_logit":
        out["attn_sinks"] = _shape(_LAYER["attn_sinks"], sizes)
    return out


def global_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Shape of each global tensor the config calls for, in schema order (``tok_embd`` first,
    ``lm_head`` last)."""
    ln = cfg.norm_kind == "layernorm"
    present = {"tok_embd": True, "pos_embd": cfg.positions == "learned", "type_embd": bool(cfg.type_embd),
               "embd_norm": bool(cfg.embd_norm), "embd_norm_b": bool(cfg.embd_norm) and ln,
               "out_norm": bool(cfg.has_out_norm), "out_norm_b": bool(cfg.has_out_norm) and ln,
               "lm_head": bool(cfg.has_lm_head)}
    sizes = _dim_sizes(cfg)
    return {key: _shape(row, sizes) for key, row in _GLOBAL.items() if present[key]}


def canonical_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Every canonical tensor of the contract except ``rope_inv_freq``, with its shape."""
    out = global_shapes(cfg)
    per = layer_shapes(cfg)
    for l in range(cfg.n_layers):
        out.update({f"blk.{l}.{k}": s for k, s in per.items()})
    return out


NameSpec = Union[str, Callable[[], Tensor]]


def assemble(cfg: ModelConfig, src: Any, name_of: Callable[[str], NameSpec],
             norm_plus_one: bool = False) -> Dict[str, Tensor]:
    """The canonical tensors, each fetched as ``src.get(name_of(key), shape)`` (or by calling
    ``name_of(key)`` when it returns a function, for fused or transposed file tensors).

    Matrices stay as the source gives them (float32 or :class:`QuantizedTensor`); every other
    tensor becomes float32. ``norm_plus_one``: norm multipliers are stored as w and applied as
    1 + w (Gemma in Hugging Face files), added here in float32 as HF computes it. The LM head
    is the embedding object itself when ``cfg.tied_embeddings``.
    """
    out: Dict[str, Tensor] = {}
    for key, shape in canonical_shapes(cfg).items():
        if key == "lm_head" and cfg.tied_embeddings:
            out[key] = out["tok_embd"]
            continue
        spec = name_of(key)
        t = spec() if callable(spec) else src.get(spec, shape)
        if tuple(t.shape) != shape:
            raise ValueError(f"canonical tensor {key} has shape {tuple(t.shape)}, expected {shape}")
        if not is_matrix(key):
            t = to_f32(t)
            if norm_plus_one and is_norm_weight(key):
                t = np.float32(1) + t
        out[key] = t
    return out


def table_names(global_names: Mapping[str, str], layer_names: Mapping[str, str]) -> Callable[[str], str]:
    """``name_of`` for :func:`assemble` from two tables: global key -> file name, per-layer key
    -> file name template with ``{l}``."""
    def name_of(key: str) -> str:
        if key.startswith("blk."):
            _, l, sub = key.split(".", 2)
            if sub not in layer_names:
                raise ValueError(f"this family has no file name for per-layer tensor {sub!r}")
            return layer_names[sub].format(l=int(l))
        if key not in global_names:
            raise ValueError(f"this family has no file name for tensor {key!r}")
        return global_names[key]
    return name_of


def with_aliases(names: Iterable[str], aliases: Sequence[Tuple[str, str]]) -> Callable[[str], str]:
    """Maps a canonical file name onto the one the file uses when the model was saved inside a
    wrapper (``bert.``, ``transformer.``, Gemma 3's ``language_model.``): for each (prefix,
    replacement) whose prefix starts the name, the replaced name if the file has it. Names the
    file lacks come back unchanged, so the loader's error names the expected tensor."""
    have = set(names)

    def resolve(name: str) -> str:
        if name in have:
            return name
        for prefix, repl in aliases:
            if name.startswith(prefix) and repl + name[len(prefix):] in have:
                return repl + name[len(prefix):]
        return name
    return resolve


# ------------------------------------------------------------------ configs
def hf_need(c: Mapping[str, Any], path: str) -> Callable[[str], Any]:
    def need(key: str) -> Any:
        if c.get(key) is None:
            raise KeyError(f"{path} is missing the config key {key!r}")
        return c[key]
    return need


def rope_scaling_dict(params: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """A Hugging Face RoPE scaling dict (``rope_scaling`` or ``rope_parameters``) as
    :class:`~sinklab.families.config.ModelConfig` takes it: ``rope_type`` set (from ``type``
    if absent), without its base ``rope_theta``; None for the default (no scaling)."""
    if not params:
        return None
    s = dict(params)
    s.setdefault("rope_type", s.get("type", "default"))
    s.pop("rope_theta", None)
    return None if s["rope_type"] in (None, "default") else s


def hf_rope(c: Mapping[str, Any], default_theta: float = 10000.0) -> Tuple[float, Optional[Dict[str, Any]]]:
    """RoPE base and scaling from transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters)."""
    params = c.get("rope_parameters") or {}
    theta = c.get("rope_theta", params.get("rope_theta", default_theta))
    return float(theta if theta is not None else default_theta), rope_scaling_dict(c.get("rope_scaling") or params)


def hf_common(c: Mapping[str, Any], path: str, family: str) -> Dict[str, Any]:
    """ModelConfig fields most decoders state the same way in config.json (LLaMA naming)."""
    need = hf_need(c, path)
    d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    theta, scaling = hf_rope(c)
    bos, eos = c.get("bos_token_id"), c.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    eos = None if isinstance(eos, list) else eos
    return dict(arch=c["model_type"], family=family,
                n_layers=int(need("num_hidden_layers")), n_heads=heads,
                n_kv_heads=int(c.get("num_key_value_heads") or heads), d_model=d,
                head_dim=int(c.get("head_dim") or d // heads), d_ff=int(need("intermediate_size")),
                vocab_size=int(need("vocab_size")),
                context_length=int(c.get("max_position_embeddings") or 2048),
                rope_theta=theta, rope_scaling=scaling,
                norm_eps=float(c.get("rms_norm_eps") or 1e-6),
                tied_embeddings=bool(c.get("tie_word_embeddings", False)),
                bos_token_id=None if bos is None else int(bos), eos_token_id=None if eos is None else int(eos))


def hf_layer_windows(c: Mapping[str, Any], n_layers: int, path: str) -> Optional[Tuple[int, ...]]:
    """Per-layer windows from transformers' ``layer_types`` ("sliding_attention" layers get
    ``sliding_window``, others 0); None when no layer slides."""
    types = c.get("layer_types")
    if types is None:
        return None
    if len(types) != n_layers:
        raise ValueError(f"{path}: layer_types has {len(types)} entries for {n_layers} layers")
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"{path}: unsupported layer types {unknown} (supported: sliding_attention, full_attention)")
    if "sliding_attention" not in types:
        return None
    w = c.get("sliding_window")
    if not w:
        raise KeyError(f"{path} has sliding_attention layers but no sliding_window")
    return tuple(int(w) if t == "sliding_attention" else 0 for t in types)


def read_hf_json(path: str) -> Dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def gguf_common(meta: Any, family: str) -> Dict[str, Any]:
    """ModelConfig fields llama.cpp writes the same way for every decoder ({arch}.* keys)."""
    arch = meta.arch
    p = arch + "."
    d_model = int(meta.get(p + "embedding_length"))
    n_heads = int(meta.get(p + "attention.head_count"))
    head_dim = int(meta.get(p + "attention.key_length", d_model // max(n_heads, 1)))
    kv = meta.get(p + "attention.head_count_kv", n_heads)
    if isinstance(kv, (list, tuple)):  # per-layer counts: only uniform ones are supported
        if len(set(kv)) != 1:
            raise ValueError(f"per-layer kv head counts {kv} are not supported")
        kv = kv[0]
    n_layers = int(meta.get(p + "block_count"))
    vocab = meta.get(p + "vocab_size", None)
    if vocab is None:  # the embedding's rows; the token list only if that is missing (slow to read)
        embd = meta.tensor_shape("token_embd.weight")
        vocab = embd[0] if embd else len(meta.get("tokenizer.ggml.tokens", None) or ())
    bos = meta.get("tokenizer.ggml.bos_token_id", None)
    eos = meta.get("tokenizer.ggml.eos_token_id", None)
    return dict(arch=arch, family=family, n_layers=n_layers, n_heads=n_heads, n_kv_heads=int(kv),
                d_model=d_model, head_dim=head_dim, d_ff=int(meta.get(p + "feed_forward_length")),
                vocab_size=int(vocab), context_length=int(meta.get(p + "context_length")),
                rope_theta=float(meta.get(p + "rope.freq_base", 10000.0)),
                tied_embeddings="output.weight" not in meta.tensor_names,
                bos_token_id=None if bos is None else int(bos), eos_token_id=None if eos is None else int(eos))


def gguf_rope_checks(meta: Any, head_dim: int) -> Optional[Dict[str, Any]]:
    """Rejects partial rotary embeddings; returns the linear RoPE scaling stated in metadata
    (llama3 scaling lives in the ``rope_freqs.weight`` tensor instead)."""
    p = meta.arch + "."
    rope_dim = int(meta.get(p + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary embeddings (rope.dimension_count={rope_dim} < head_dim={head_dim}) are not supported")
    kind = meta.get(p + "rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise ValueError(f"unsupported RoPE scaling type {kind!r} in GGUF (supported: linear, llama3 via rope_freqs)")
    return {"rope_type": "linear", "factor": float(meta.get(p + "rope.scaling.factor"))}


def float32_sqrt(x: float) -> float:
    """float32(sqrt(x)) as a Python float (Gemma's embedding normalizer, a float32 tensor)."""
    return float(np.float32(math.sqrt(x)))
