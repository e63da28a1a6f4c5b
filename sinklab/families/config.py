"""Model configuration shared by every loader: the numbers the C forward needs, named once."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a LLaMA-family decoder, read from a GGUF file or a Hugging Face folder.

    Attributes:
        arch: architecture name as the file states it (``"llama"``).
        n_layers, n_heads, n_kv_heads: layers L, query heads H, key/value heads G (G divides H).
        d_model: residual width d. head_dim: per-head width. d_ff: MLP hidden width.
        vocab_size: V. context_length: the longest sequence the model was trained for.
        rope_theta: RoPE base. rope_scaling: None or a dict such as
            ``{"rope_type": "llama3", "factor": 8.0, ...}`` or ``{"rope_type": "linear", "factor": 2.0}``.
        norm_eps: RMSNorm epsilon. tied_embeddings: output head shares the embedding matrix.
        bos_token_id, eos_token_id: special token ids (None if the file has none).
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

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads", "n_kv_heads", "d_model", "head_dim", "d_ff",
                     "vocab_size", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model config {name}={value!r} must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)
