"""Loading LLaMA-family models from Hugging Face folders: config.json + *.safetensors.

Safetensors files are memory-mapped and read through their JSON header directly: the format is
an 8-byte header length, a JSON table of {name: dtype, shape, data_offsets}, then raw data. The
`safetensors` package's numpy backend has no bfloat16 and always copies; reading the table
ourselves keeps fp32 weights zero-copy. Every offset and size is checked against the file.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Iterable, Tuple

import numpy as np

from ..families import llama
from ..families.config import ModelConfig

SUPPORTED_MODEL_TYPES = llama.ARCHS
_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that is truncated, corrupted, or holds a dtype sinklab does not read."""


def read_safetensors(path: str) -> Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]]:
    """Maps a .safetensors file: {name: (dtype, shape, raw 1-D array view into the file)}."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: file too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            table = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else np.zeros(0, np.uint8)
    out = {}
    for name, info in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: malformed header entry for {name!r}") from None
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype} (supported: F32, F16, BF16)")
        itemsize = _DTYPES[dtype][1]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if any(s < 0 for s in shape) or not (0 <= lo <= hi <= data_len) or hi - lo != count * itemsize:
            raise SafetensorsError(f"{path}: tensor {name} (shape {shape}, {dtype}) has offsets {lo}..{hi} "
                                   f"inconsistent with its size or past the end of the file ({data_len} data bytes)")
        out[name] = (dtype, shape, mm[lo:hi])
    return out


def to_f32(dtype: str, shape: Tuple[int, ...], raw: np.ndarray) -> np.ndarray:
    """Raw safetensors bytes as float32 of ``shape``: a zero-copy view for aligned F32."""
    np_type, itemsize = _DTYPES[dtype]
    if dtype == "F32" and raw.ctypes.data % 4 == 0:
        return raw.view(np.float32).reshape(shape)
    arr = np.frombuffer(raw, dtype=np_type) if raw.ctypes.data % itemsize else raw.view(np_type)
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return arr.astype(np.float32).reshape(shape)


def _files(folder: str) -> Iterable[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [x for x in files if not os.path.isfile(os.path.join(folder, x))]
        if missing:
            raise FileNotFoundError(f"{folder}: shards named in model.safetensors.index.json are missing: {missing}")
        return [os.path.join(folder, x) for x in files]
    files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    return [os.path.join(folder, x) for x in files]


def _rope_from_hf(c: Dict[str, Any]) -> Tuple[float, Any]:
    """RoPE base and scaling from either transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters)."""
    params = c.get("rope_parameters") or {}
    theta = c.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = c.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    if scaling is not None:
        scaling = dict(scaling)
        scaling.setdefault("rope_type", scaling.get("type", "default"))
        scaling.pop("rope_theta", None)
        if scaling["rope_type"] == "default":
            scaling = None
    return float(theta), scaling


def read_config(folder: str) -> ModelConfig:
    """The ModelConfig of a Hugging Face folder's config.json."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no config.json")
    with open(path) as f:
        c = json.load(f)
    kind = c.get("model_type")
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"unsupported architecture {kind!r} in {path} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for flag in ("attention_bias", "mlp_bias"):
        if c.get(flag):
            raise ValueError(f"{path}: {flag}=true is not supported")
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{path}: hidden_act={act!r} is not supported (LLaMA uses silu)")

    def need(key: str) -> Any:
        if key not in c:
            raise KeyError(f"{path} is missing the config key {key!r}")
        return c[key]

    d, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    theta, scaling = _rope_from_hf(c)
    bos, eos = c.get("bos_token_id"), c.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    return ModelConfig(
        arch=kind,
        n_layers=int(need("num_hidden_layers")),
        n_heads=heads,
        n_kv_heads=int(c.get("num_key_value_heads") or heads),
        d_model=d,
        head_dim=int(c.get("head_dim") or d // heads),
        d_ff=int(need("intermediate_size")),
        vocab_size=int(need("vocab_size")),
        context_length=int(c.get("max_position_embeddings", 2048)),
        rope_theta=theta,
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
        rope_scaling=scaling,
    )


def load_hf_weights(folder: str, cfg: ModelConfig) -> Dict[str, np.ndarray]:
    """Weights named as the C core expects, fp32 (out, in); fp32 files are not copied."""
    table: Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]] = {}
    for path in _files(folder):
        table.update(read_safetensors(path))
    def get(name: str, shape: Tuple[int, ...]) -> np.ndarray:
        if name not in table:
            raise KeyError(f"{folder}: missing tensor {name!r}")
        dtype, got, raw = table[name]
        if got != shape:
            raise ValueError(f"{folder}: tensor {name} has shape {got}, expected {shape}")
        return to_f32(dtype, shape, raw)

    return llama.canonical_weights(cfg, "hf", get)
