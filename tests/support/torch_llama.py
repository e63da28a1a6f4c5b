"""A LLaMA-2-style decoder in plain PyTorch (fp32), written independently of sinklab, as the
reference that sinklab's training engine is measured and tested against.

RMSNorm, RoPE in Hugging Face's rotate-half layout (dimension i pairs with i + hd/2), SwiGLU MLP,
no biases, grouped-query attention (query head h reads kv head h // (H/G), as HF's repeat_kv),
optional tied embeddings. Attention is causal by default, or follows a dense boolean mask
(B, T, T), True where query i may see key j (intra-document masking, a fixed first key). The
attention variants of sinklab's ModelConfig.attn_variant: a learned sink logit per head
(``sinks``) or softmax-plus-one as an extra logit column dropped after the softmax, and gated
attention's sigmoid gate on z before W_O (``attn_gate``).

    model = TorchLlama.from_config(cfg); copy_sinklab_weights(model, trainer.weights)
    opt = make_adamw(model, lr, weight_decay=0.1)
    loss, norm = torch_train_step(model, opt, ids, targets, mask=None, clip=1.0)
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, d: int, H: int, G: int, F_: int, eps: float, attn_variant: str = "softmax") -> None:
        super().__init__()
        self.H, self.G, self.hd, self.variant = H, G, d // H, attn_variant
        if attn_variant == "sink_logit":   # sinklab's s_h: initialised 0
            self.sinks = nn.Parameter(torch.zeros(H))
        if attn_variant == "gated":
            self.attn_gate = nn.Linear(d, H * self.hd, bias=False)
        self.attn_norm, self.ffn_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.q = nn.Linear(d, H * self.hd, bias=False)
        self.k = nn.Linear(d, G * self.hd, bias=False)
        self.v = nn.Linear(d, G * self.hd, bias=False)
        self.o = nn.Linear(H * self.hd, d, bias=False)
        self.gate = nn.Linear(d, F_, bias=False)
        self.up = nn.Linear(d, F_, bias=False)
        self.down = nn.Linear(F_, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        B, T, _ = x.shape
        a = self.attn_norm(x)
        q = self.q(a).view(B, T, self.H, self.hd).transpose(1, 2)   # (B, H, T, hd)
        k = self.k(a).view(B, T, self.G, self.hd).transpose(1, 2)   # (B, G, T, hd)
        v = self.v(a).view(B, T, self.G, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.G != self.H:
            k, v = k.repeat_interleave(self.H // self.G, 1), v.repeat_interleave(self.H // self.G, 1)
        if self.variant in ("sink_logit", "softmax1"):
            z = self.sink_attention(q, k, v, mask)
        elif mask is None:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
        z = z.transpose(1, 2).reshape(B, T, self.H * self.hd)
        if self.variant == "gated":
            z = z * torch.sigmoid(self.attn_gate(a))
        x = x + self.o(z)
        m = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


    def sink_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Softmax over the keys and one extra logit per head (s_h, or 0 for softmax-plus-one),
        the extra column dropped after it: eager, as a PyTorch user writes it."""
        T = q.shape[2]
        z = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        seen = torch.ones(T, T, dtype=torch.bool).tril() if mask is None else mask[:, None]
        z = z.masked_fill(~seen, float("-inf"))
        s = self.sinks if self.variant == "sink_logit" else torch.zeros(self.H, dtype=z.dtype)
        p = torch.softmax(torch.cat([z, s[:, None, None].expand(z.shape[:-1] + (1,))], -1), -1)[..., :T]
        return p @ v


class TorchLlama(nn.Module):
    """forward(ids (B, T) int64, mask None or (B, T, T) bool) -> logits (B, T, V) float32."""

    def __init__(self, vocab_size: int, d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
                 rope_theta: float = 10000.0, norm_eps: float = 1e-5, tied_embeddings: bool = False,
                 attn_variant: str = "softmax") -> None:
        super().__init__()
        self.tok_embd = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, n_kv_heads, d_ff, norm_eps, attn_variant)
                                    for _ in range(n_layers))
        self.out_norm = RMSNorm(d_model, norm_eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tied_embeddings:
            self.lm_head.weight = self.tok_embd.weight
        hd = d_model // n_heads
        self.register_buffer("inv_freq", 1.0 / rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd),
                             persistent=False)

    @classmethod
    def from_config(cls, cfg: Any) -> "TorchLlama":
        """From any object with sinklab's ModelConfig attribute names (duck-typed)."""
        return cls(cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff,
                   cfg.rope_theta, cfg.norm_eps, cfg.tied_embeddings, getattr(cfg, "attn_variant", "softmax"))

    def forward(self, ids: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        T = ids.shape[1]
        ang = torch.outer(torch.arange(T, dtype=torch.float64), self.inv_freq)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().float(), ang.sin().float()
        x = self.tok_embd(ids)
        for blk in self.blocks:
            x = blk(x, cos, sin, mask)
        return self.lm_head(self.out_norm(x))


def sinklab_parameters(model: TorchLlama) -> Dict[str, nn.Parameter]:
    """Canonical sinklab name -> the model's parameter (a tied head appears once, as tok_embd)."""
    pairs = {"tok_embd": model.tok_embd.weight, "out_norm": model.out_norm.weight}
    if model.lm_head.weight is not model.tok_embd.weight:
        pairs["lm_head"] = model.lm_head.weight
    for l, b in enumerate(model.blocks):
        for name, p in (("attn_norm", b.attn_norm.weight), ("attn_q", b.q.weight), ("attn_k", b.k.weight),
                        ("attn_v", b.v.weight), ("attn_output", b.o.weight), ("ffn_norm", b.ffn_norm.weight),
                        ("ffn_gate", b.gate.weight), ("ffn_up", b.up.weight), ("ffn_down", b.down.weight)):
            pairs[f"blk.{l}.{name}"] = p
        if b.variant == "sink_logit":
            pairs[f"blk.{l}.attn_sinks"] = b.sinks
        if b.variant == "gated":
            pairs[f"blk.{l}.attn_gate"] = b.attn_gate.weight
    return pairs


def copy_sinklab_weights(model: TorchLlama, weights: Mapping[str, np.ndarray]) -> None:
    """Copies canonical-name (out, in) float32 arrays (a sinklab Trainer's ``weights``) into model."""
    with torch.no_grad():
        for name, p in sinklab_parameters(model).items():
            w = torch.from_numpy(np.asarray(weights[name], dtype=np.float32))
            if tuple(w.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {tuple(w.shape)}, the torch model wants {tuple(p.shape)}")
            p.copy_(w)


def make_adamw(model: nn.Module, lr: float, betas: Tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
               weight_decay: float = 0.1) -> torch.optim.AdamW:
    """torch.optim.AdamW with weight decay on the 2-D parameters only (matrices, embedding), none
    on the norms; foreach=False (the plain per-tensor loop)."""
    ps = list(model.parameters())  # a tied embedding appears once
    groups = [{"params": [p for p in ps if p.ndim == 2], "weight_decay": weight_decay},
              {"params": [p for p in ps if p.ndim != 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)


def intra_document_mask(key_start: np.ndarray, keep_first: bool = False) -> torch.Tensor:
    """Dense (B, T, T) bool mask from (B, T) document starts: query i sees keys key_start[i]..i,
    and key 0 as well with keep_first (a fixed first token)."""
    ks = torch.as_tensor(np.asarray(key_start), dtype=torch.int64)
    T = ks.shape[1]
    j = torch.arange(T)
    mask = (j[None, None, :] <= j[None, :, None]) & (j[None, None, :] >= ks[:, :, None])
    if keep_first:
        mask[:, :, 0] = True
    return mask


def torch_train_step(model: nn.Module, opt: torch.optim.Optimizer, ids: Any, targets: Any,
                     mask: Optional[torch.Tensor] = None, clip: float = 1.0,
                     lr: Optional[float] = None) -> Tuple[float, float]:
    """One AdamW step: mean cross-entropy over targets >= 0, backward, clip_grad_norm_(clip)
    (clip <= 0: no clipping), opt.step(). ids, targets: (B, T) int. lr: set on every group first.
    Returns (loss in nats before the update, gradient L2 norm before clipping)."""
    ids = torch.as_tensor(np.asarray(ids), dtype=torch.int64)
    tg = torch.as_tensor(np.asarray(targets), dtype=torch.int64).clone()
    tg[tg < 0] = -100
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    logits = model(ids, mask)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tg.reshape(-1), ignore_index=-100)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
    opt.step()
    return float(loss.detach()), float(norm)
