"""The training engine: a LLaMA-style model whose parameters, gradients and AdamW moments live in
four flat float32 buffers owned by the C core (as llm.c keeps them), the model's weights being
NumPy views into the parameter buffer, so the same :class:`sinklab.Model` runs every analysis on
the weights as they train. One call of :meth:`Trainer.step` is one optimizer step in C: the loss
gradient of each packed window (causal, intra-document, with or without a fixed ⟨bos⟩; the
paper's §5 strategies), global-norm clipping and AdamW, with the GIL released.
"""
from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np

from .. import _core
from ..families import base
from ..families.config import ModelConfig
from ..model import PRECISIONS, Model
from ..runtime import Terminated
from ..system import available_memory

ROPE_HALF_SPLIT = 0  # Hugging Face's rotate-half layout: checkpoints are plain HF LLaMA folders


# Precisions of a training step (a subset of the forward's, with the C core's numbers).
TRAIN_PRECISIONS = {p: PRECISIONS[p] for p in ("fp32", "bf16")}


def check_train_precision(precision: Any) -> str:
    """``precision`` checked: ``"fp32"`` or ``"bf16"``; ValueError naming the choices otherwise."""
    if isinstance(precision, str) and precision in TRAIN_PRECISIONS:
        return precision
    raise ValueError(f"unknown training precision {precision!r}; choose 'fp32' (exact, the default) or 'bf16' "
                     "(bf16 weight products, fp32 master weights and AdamW)")


def llama_config(vocab_size: int, d_model: int = 256, n_layers: int = 4, n_heads: int = 4,
                 n_kv_heads: Optional[int] = None, d_ff: Optional[int] = None, context_length: int = 1024,
                 rope_theta: float = 10000.0, norm_eps: float = 1e-5, tied_embeddings: bool = False,
                 bos_token_id: Optional[int] = None, eos_token_id: Optional[int] = None,
                 attn_variant: str = "softmax") -> ModelConfig:
    """A LLaMA-2-style decoder (RMSNorm, RoPE, SwiGLU, no biases), the paper's §5 architecture
    at a CPU size. ``d_ff`` defaults to LLaMA's 8/3·d rounded up to a multiple of 64.
    ``attn_variant``: the attention (``ModelConfig.attn_variant``): ``"softmax"``, or a variant
    that needs no ⟨bos⟩ sink: ``"sink_logit"``, ``"softmax1"``, ``"gated"``."""
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    if d_ff is None:
        d_ff = 64 * math.ceil(8 * d_model / 3 / 64)
    return ModelConfig(arch="llama", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads,
                       d_model=d_model, head_dim=d_model // n_heads, d_ff=d_ff, vocab_size=vocab_size,
                       context_length=context_length, rope_theta=rope_theta, norm_eps=norm_eps,
                       tied_embeddings=tied_embeddings, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                       attn_variant=attn_variant)


@dataclass(frozen=True)
class Slot:
    """Where canonical tensor ``name`` lies in the flat buffers: elements [offset, offset+size)."""
    name: str
    shape: Tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


def param_layout(cfg: ModelConfig) -> List[Slot]:
    """The flat buffer's tensors in canonical order (``lm_head`` absent when tied), each start
    aligned to 16 floats (64 bytes) so every weight row block starts on a cache line."""
    slots, at = [], 0
    for name, shape in base.canonical_shapes(cfg).items():
        if name == "lm_head" and cfg.tied_embeddings:
            continue
        slots.append(Slot(name, tuple(shape), at))
        at += -(-int(np.prod(shape)) // 16) * 16
    return slots


def decays(name: str) -> bool:
    """Weight decay applies to the matrices and the embedding (2-D tensors, gated attention's W_g
    among them), not to norms nor to the sink logits s_h (a decay would pull every head's sink
    towards 0, i.e. towards softmax-plus-one)."""
    return not base.is_norm_weight(name) and not base.is_sink_logit(name)


def lr_schedule(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    """Learning rate of optimizer step ``step`` (1-based): linear warmup from lr/warmup to lr over
    ``warmup`` steps, then a cosine from lr down to ``min_lr`` at step ``total``."""
    if step < 1:
        raise ValueError(f"steps are 1-based, got {step}")
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass
class AdamW:
    """torch.optim.AdamW's hyperparameters and the clipping of torch.nn.utils.clip_grad_norm_."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


def _check_train_memory(n: int, grad_groups: int) -> None:
    """MemoryError before allocating when the flat buffers (parameters, gradients, two Adam
    moments, one gradient buffer per extra group: (3 + grad_groups) n float32) exceed the
    available memory."""
    need = 4 * n * (3 + grad_groups)
    avail = available_memory()
    if avail is not None and need > avail:
        raise MemoryError(f"the trainer's buffers for {n:,} parameters need {need / 1e9:.2f} GB "
                          f"(parameters, gradients, 2 Adam moments and {grad_groups - 1} extra gradient "
                          f"group(s)) but only {avail / 1e9:.2f} GB is available; use a smaller model "
                          f"(d_model, n_layers, vocab_size) or grad_groups=1")


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Holds Python's SIGINT and SIGTERM handlers (KeyboardInterrupt, and
    :class:`sinklab.runtime.Terminated` where installed) until the block ends, so that a signal
    arriving just as a C call returns cannot split the call from the bookkeeping that must follow
    it. A KeyboardInterrupt the C call raises itself (it stopped before changing anything) still
    propagates at once. Main thread only (elsewhere Python runs no handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # SIG_IGN / SIG_DFL: nothing Python-level to hold
    prev = {sig: h for sig in (signal.SIGINT, signal.SIGTERM) if callable(h := signal.getsignal(sig))}
    held: List[Any] = []
    for sig in prev:
        signal.signal(sig, lambda sig, frame: held.append((sig, frame)))
    try:
        yield
    except KeyboardInterrupt as e:  # the C call stopped for a held signal: say which
        if type(e) is KeyboardInterrupt and held and held[0][0] == signal.SIGTERM:
            raise Terminated("terminated (SIGTERM)") from None
        raise
    finally:
        for sig, h in prev.items():
            signal.signal(sig, h)
    if held:  # the block completed: now run the first handler it held back (raises)
        sig, frame = held[0]
        prev[sig](sig, frame)


class Trainer:
    """Parameters, gradients and Adam moments of a LLaMA-style model in C-owned flat buffers.

    Attributes:
        config: the architecture.
        params, grads, mom, vel: the flat float32 buffers (n,), NumPy views of C memory.
        weights: canonical name -> (view of ``params``) with the tensor's shape; ``grad_views``
            the same over ``grads``.
        model: a :class:`sinklab.Model` over ``weights``: every analysis runs on the live weights.
        step_count: optimizer steps taken.
        precision: ``"fp32"`` (the exact engine, the default) or ``"bf16"``: the weight products
            of the forward and the backward (dX = dY·W, dW = dYᵀ·X) with bf16-rounded inputs and
            fp32 accumulation, every weight packed to bf16 from the fp32 parameters once per step;
            attention, norms, the loss, gradient sums, clipping and AdamW stay fp32 and the
            parameters and moments are fp32 master copies (csrc/train.h). A step gives the same
            bits for any thread count at either precision.
    """

    def __init__(self, config: ModelConfig, seed: int = 0, init_std: float = 0.02, tokenizer: Any = None,
                 optimizer: Optional[AdamW] = None, init: bool = True, grad_groups: int = 2,
                 precision: str = "fp32") -> None:
        self.precision = check_train_precision(precision)
        if config.family != "llama" or config.biases or config.norm_kind != "rmsnorm" or config.act != "swiglu":
            raise ValueError("the trainer builds LLaMA-style decoders (RMSNorm, RoPE, SwiGLU, no biases); "
                             f"got family {config.family!r}")
        self.config = config
        self.optimizer = optimizer or AdamW()
        self.layout = param_layout(config)
        last = self.layout[-1]
        self.n_params = sum(s.size for s in self.layout)
        n = last.offset + last.size
        if grad_groups < 1:
            raise ValueError(f"grad_groups must be >= 1, got {grad_groups}")
        _check_train_memory(n, grad_groups)
        self.params, self.grads, self.mom, self.vel = _core.train_buffers(n, 4)
        self.weights = {s.name: self.params[s.offset:s.offset + s.size].reshape(s.shape) for s in self.layout}
        self.grad_views = {s.name: self.grads[s.offset:s.offset + s.size].reshape(s.shape) for s in self.layout}
        if config.tied_embeddings:
            self.weights["lm_head"] = self.weights["tok_embd"]
        self._core_grads = dict(self.grad_views)
        if config.tied_embeddings:
            self._core_grads["lm_head"] = self.grad_views["tok_embd"]
        self.decay_ranges = np.array([[s.offset, s.offset + s.size] for s in self.layout if decays(s.name)],
                                     dtype=np.int64).reshape(-1, 2)
        # The batch's windows form grad_groups fixed groups whose gradients are summed apart and
        # then added in order (csrc/train.h): groups run in parallel without barriers, and the
        # bits depend on grad_groups, never on the thread count. Each extra group costs n floats.
        self.grad_groups = int(grad_groups)
        self._group_grads = (_core.train_buffers((grad_groups - 1) * n, 1)[0].reshape(grad_groups - 1, n)
                             if grad_groups > 1 else None)
        self.step_count = 0
        if init:
            self.initialize(seed, init_std)
        self.model = Model(config, self.weights, tokenizer, "<training>", ROPE_HALF_SPLIT, name="training")

    def initialize(self, seed: int, std: float = 0.02) -> None:
        """GPT-2/LLaMA initialisation: norms 1; matrices and the embedding N(0, std²), the two
        projections back into the residual stream (W_O, W_down) N(0, (std/sqrt(2L))²); gated
        attention's W_g N(0, std²) (the gate starts near sigmoid(0) = 1/2 everywhere); sink
        logits s_h 0 (the sink starts as softmax-plus-one's). Drawn tensor by tensor in layout
        order from PCG64(seed), in float64 then rounded; s_h draws nothing, so the other tensors
        of a softmax model's layout get the same values as before the variants existed."""
        rng = np.random.Generator(np.random.PCG64(seed))
        out_std = std / math.sqrt(2 * self.config.n_layers)
        for s in self.layout:
            w = self.weights[s.name]
            if base.is_norm_weight(s.name):
                w[...] = 1.0
            elif base.is_sink_logit(s.name):
                w[...] = 0.0
            else:
                sd = out_std if s.name.endswith(("attn_output", "ffn_down")) else std
                w[...] = rng.normal(0.0, sd, s.shape)
        self.mom[:] = 0.0
        self.vel[:] = 0.0
        self.step_count = 0

    def step(self, ids: np.ndarray, targets: np.ndarray, lr: float, key_start: Optional[np.ndarray] = None,
             keep_first: bool = False) -> Tuple[float, float]:
        """One AdamW step on a batch of windows.

        Args:
            ids, targets: (B, T) int64 token ids and next-token targets (negative: no target).
            lr: the learning rate of this step (see :func:`lr_schedule`).
            key_start: None (causal over each window) or (B, T) int64 document starts
                (intra-document masking: query i sees keys key_start[i]..i).
            keep_first: with ``key_start``, key 0 (a fixed ⟨bos⟩) stays visible to every query.

        Returns:
            (loss, grad_norm): the batch's mean cross-entropy in nats before the update, and the
            gradient's global L2 norm before clipping.

        Raises:
            KeyboardInterrupt: Ctrl-C. The step is applied whole (``step_count`` counts it) or
                not at all; a caller that catches it can go on from ``step_count``.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        targets = np.ascontiguousarray(targets, dtype=np.int64)
        if ids.ndim != 2 or targets.shape != ids.shape:
            raise ValueError(f"ids and targets must both be (B, T), got {ids.shape} and {targets.shape}")
        V = self.config.vocab_size
        if ids.min() < 0 or ids.max() >= V or targets.max() >= V:
            raise ValueError(f"token ids and targets must lie in [0, {V}) (targets may be negative: no target)")
        if key_start is not None:
            key_start = np.ascontiguousarray(key_start, dtype=np.int64)
        o = self.optimizer
        groups = min(self.grad_groups, ids.shape[0])
        # Ctrl-C: the C step either stops before the update (KeyboardInterrupt, nothing changed) or
        # applies it whole; a SIGINT (or SIGTERM) that lands as it returns is held until step_count
        # agrees with the weights, so an interrupted trainer is always at a step boundary.
        group_grads = None
        if groups > 1:
            assert self._group_grads is not None      # allocated for grad_groups > 1 in __init__
            group_grads = self._group_grads[:groups - 1]
        with _interrupts_deferred():
            loss, norm = _core.train_step(self.model._handle, self._core_grads, self.params, self.grads, self.mom,
                                          self.vel, self.decay_ranges, ids, targets, key_start, bool(keep_first),
                                          float(lr), o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_clip,
                                          self.step_count + 1,
                                          group_grads, TRAIN_PRECISIONS[self.precision])
            self.step_count += 1
        return float(loss), float(norm)
