"""Loading LLaMA-family models from GGUF files through the reference `gguf` reader.

The file is memory-mapped; fp32 tensors are used in place (zero copy), every other type is
dequantised to fp32 by the C core. GGUF stores the Q and K projection rows permuted for RoPE on
adjacent pairs (llama.cpp's convention), so the model runs RoPE in that layout: q·k, and hence
every attention probability, equals the Hugging Face result with its half-split layout.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import numpy as np

from .. import _core
from ..families import llama
from ..families.config import ModelConfig

SUPPORTED_ARCHS = llama.ARCHS
# ggml type ids the C core decodes (see csrc/quant.h)
SUPPORTED_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
                   12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}


class GGUFError(ValueError):
    """A GGUF file that is truncated, corrupted, or describes something sinklab cannot run."""


def open_gguf(path: str):
    """Opens ``path`` with ``gguf.GGUFReader`` (memory-mapped), turning parse failures into GGUFError."""
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad data
        raise GGUFError(f"{path}: corrupted or truncated GGUF ({type(e).__name__}: {e})") from None


def _field(reader, key: str, default: Any = KeyError) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is KeyError:
            raise GGUFError(f"GGUF metadata key {key!r} is missing")
        return default
    try:
        return f.contents()
    except Exception as e:
        raise GGUFError(f"GGUF metadata key {key!r} is unreadable: {e}") from None


def read_config(reader) -> ModelConfig:
    """The ModelConfig stated by a GGUF file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    p = arch + "."
    d_model = int(_field(reader, p + "embedding_length"))
    n_heads = int(_field(reader, p + "attention.head_count"))
    head_dim = int(_field(reader, p + "attention.key_length", d_model // max(n_heads, 1)))
    rope_dim = int(_field(reader, p + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFError(f"partial rotary embeddings (rope.dimension_count={rope_dim} < head_dim={head_dim}) are not supported")
    tok = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, p + "vocab_size", len(tok.data) if tok is not None else 0))
    scaling = None
    kind = _field(reader, p + "rope.scaling.type", None)
    if kind not in (None, "none"):
        if kind != "linear":
            raise GGUFError(f"unsupported RoPE scaling type {kind!r} in GGUF (supported: linear, llama3 via rope_freqs)")
        scaling = {"rope_type": "linear", "factor": float(_field(reader, p + "rope.scaling.factor"))}
    bos = _field(reader, "tokenizer.ggml.bos_token_id", None)
    eos = _field(reader, "tokenizer.ggml.eos_token_id", None)
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        arch=arch,
        n_layers=int(_field(reader, p + "block_count")),
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, p + "attention.head_count_kv", n_heads)),
        d_model=d_model,
        head_dim=head_dim,
        d_ff=int(_field(reader, p + "feed_forward_length")),
        vocab_size=vocab,
        context_length=int(_field(reader, p + "context_length")),
        rope_theta=float(_field(reader, p + "rope.freq_base", 10000.0)),
        norm_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon")),
        tied_embeddings="output.weight" not in names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        rope_scaling=scaling,
    )


def tensor_to_f32(t, expected_shape: Tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor as a C-contiguous float32 array of ``expected_shape`` (numpy order).

    F32 data is returned as a read-only view of the memory map; other types are decoded in C.
    """
    type_id = int(t.tensor_type)
    if type_id not in SUPPORTED_TYPES:
        raise GGUFError(f"tensor {t.name}: unsupported tensor type {t.tensor_type.name} ({type_id})")
    shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # GGUF lists ne0 (fastest) first
    if shape != tuple(expected_shape):
        raise GGUFError(f"tensor {t.name} has shape {shape}, expected {tuple(expected_shape)}")
    n = int(np.prod(shape))
    raw = np.asarray(t.data)
    block_elems, block_bytes = _core.quant_block_size(type_id)
    if n % block_elems:
        raise GGUFError(f"tensor {t.name}: {n} elements is not a whole number of {SUPPORTED_TYPES[type_id]} blocks")
    if raw.nbytes != n // block_elems * block_bytes:
        raise GGUFError(f"tensor {t.name}: data holds {raw.nbytes} bytes, expected "
                        f"{n // block_elems * block_bytes} (file truncated or corrupted)")
    if type_id == 0:
        return raw.reshape(shape)
    data = raw.reshape(-1).view(np.uint8)
    return _core.dequantize(type_id, data, n).reshape(shape)


def load_gguf_weights(reader, cfg: ModelConfig) -> Dict[str, np.ndarray]:
    """Weights named as the C core expects (``tok_embd``, ``blk.N.attn_q`` …; the family's schema
    in :mod:`sinklab.families.llama`), fp32, numpy order (out, in)."""
    by_name = {t.name: t for t in reader.tensors}

    def get(name: str, shape: Tuple[int, ...]) -> np.ndarray:
        if name not in by_name:
            raise GGUFError(f"GGUF file lacks tensor {name!r}")
        return tensor_to_f32(by_name[name], shape)

    return llama.canonical_weights(cfg, "gguf", get)


def llama3_rope_factors(reader, cfg: ModelConfig):
    """llama.cpp stores llama3 frequency scaling as a tensor of divisors, ``rope_freqs.weight``."""
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return tensor_to_f32(t, (cfg.head_dim // 2,)).astype(np.float64)
    return None
