"""The user-facing model: load a file or a registered name, tokenize, run with capture."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from .io import gguf_loader, hf_loader, hub, registry
from .families.config import ModelConfig
from .families.rope import layer_inv_freq
from .families.tensors import QuantizedTensor, to_f32
from .interventions import Intervention, core_arrays
from .patching import check_patches, chunk_patches, derivative_patches, patch_dims
from .progress import progress_bar
from .system import available_memory  # run's size checks call this name (tests patch it here)
from .tokenizer import Tokenizer
# CAPTURES stays a module attribute of sinklab.model (normalize_capture reads it at call time)
from .trace import ACTIVATIONS, CAPTURES, STATS, AttentionStats, Trace, buffer_shapes, capture_of

DEFAULT_CAPTURE = ("attn", "resid", "logits")  # run()'s default; models without an LM head drop "logits"


ROPE_HALF_SPLIT, ROPE_ADJACENT = 0, 1
# The most token rows (sequences x padded length) one C forward call takes; a bigger batch runs
# in chunks of max(1, MAX_ROWS_PER_CALL // T) sequences, so the activations workspace the model
# keeps between calls stays bounded: rows x (2d + 2H*hd + 3G*hd + 2F + hd + 8H) floats plus
# 64*T per thread, ~200 MB for SmolLM2-135M at 8192 rows (a single sequence longer than this is
# one call of T rows). Wider models take fewer rows, so that a call's workspace stays near
# WORKSPACE_BYTES (Model.max_rows_per_call: ~2,600 rows for Qwen2.5-1.5B, ~1,400 for an 8B).
# The C core keeps at most one workspace per model, and none over 1 GiB (freed after its call);
# _core.model_release_workspace(model._handle) frees it now.
MAX_ROWS_PER_CALL = 8192
WORKSPACE_BYTES = 256 << 20

# The arithmetic of the forward's weight products (every linear layer and the LM head), as the
# C core numbers it (csrc/model.h, sl_precision). Attention's QK and PV products, softmax, norms,
# the residual stream and every statistic stay fp32 at every precision.
PRECISIONS = {"fp32": 0, "bf16": 1, "int8": 2}


def check_precision(precision: Any) -> str:
    """``precision`` checked: ``"fp32"``, ``"bf16"`` or ``"int8"``; ValueError naming the choices
    otherwise."""
    if isinstance(precision, str) and precision in PRECISIONS:
        return precision
    raise ValueError(f"unknown precision {precision!r}; choose 'fp32' (exact, the default), 'bf16' or 'int8'")


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _core_tensors(weights: Dict[str, Any]) -> Dict[str, Any]:
    """The tensors dict of ``_core.model_new``: QuantizedTensor -> (ggml_type, raw bytes), one
    tuple per object so a tied head stays the same object as the embedding."""
    done: Dict[int, Any] = {}
    out = {}
    for k, v in weights.items():
        if isinstance(v, QuantizedTensor):
            v = done.setdefault(id(v), v.core())
        out[k] = v
    return out


def _new_core_model(config: Dict[str, Any], weights: Dict[str, Any]):
    return _core.model_new(config, _core_tensors(weights))


def normalize_capture(capture: Union[str, Iterable[str]]) -> Tuple[str, ...]:
    """``capture`` as a tuple of names: a plain string is one name (``"attn"`` -> ``("attn",)``),
    any other iterable (list, tuple, set, generator) gives its elements; ValueError for names
    outside ``CAPTURES``, TypeError for non-strings."""
    names = (capture,) if isinstance(capture, str) else tuple(capture)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"capture names must be strings, got {bad!r}")
    unknown = set(names) - set(CAPTURES)
    if unknown:
        raise ValueError(f"unknown capture {sorted(unknown)}; choose from {CAPTURES}")
    return names


class VjpNorms(NamedTuple):
    """What :meth:`Model.vjp_norms` returns (float64, over the t sources that can influence
    the target)."""

    sq: np.ndarray                   # (n, B, t) squared norms per layer, cotangent and source
    spectral: Optional[np.ndarray]   # (n, t) spectral norms per layer and source, or None
    layers: List[int]                # the resid index of each row
    iters: int                       # the most Lanczos steps any block took (0 without spectral)


class Model:
    """A transformer of any supported family (LLaMA, Mistral, Qwen2/3, Gemma 1/2/3, GPT-2,
    BERT; :mod:`sinklab.families`), runnable by the C core.

    Build one with :func:`load`. ``config`` is a :class:`ModelConfig` (``config.family`` names
    the family); ``source`` the path it came from; ``name`` the registered name, if any.
    ``weights`` maps canonical names (``tok_embd``, ``blk.N.attn_q``, …) to float32 arrays or,
    for matrices kept in their file encoding (GGUF blocks, F16, BF16), :class:`QuantizedTensor`;
    :meth:`weight` gives any of them as float32. ``rope_inv_freq`` (L, head_dim/2) holds each
    layer's RoPE frequencies (absent without RoPE).

    ``precision`` (``"fp32"``, ``"bf16"`` or ``"int8"``) is the default of :meth:`run` (see
    :func:`load`); :attr:`packed_bytes` is the memory the bf16 / int8 weight panels take once
    built. The derivatives (:meth:`vjp`, :meth:`vjp_norms`, :meth:`jvp`, :meth:`jacobian`,
    :meth:`loss_and_grad`) take ``precision=`` too but run in fp32 only for now: another precision
    (asked for, or the model's default) raises ValueError rather than silently computing in fp32.
    """

    def __init__(self, config: ModelConfig, weights: Dict[str, Any], tokenizer: Any,
                 source: str, rope_layout: int, rope_factors: Optional[np.ndarray] = None,
                 name: Optional[str] = None, precision: str = "fp32") -> None:
        self.precision = check_precision(precision)
        self.config = config
        self.tokenizer = tokenizer
        self.source = source
        self.name = name or os.path.basename(os.path.normpath(source))
        self.weights = dict(weights)
        if config.positions == "rope":
            # llama.cpp's llama3 scaling (rope_factors): divisors per frequency, every layer
            self.weights["rope_inv_freq"] = layer_inv_freq(config, rope_factors)
        self.rope_layout = int(rope_layout)
        self._handle = _new_core_model(config.core_config(self.rope_layout), self.weights)

    def weight(self, name: str) -> np.ndarray:
        """Canonical tensor ``name`` as float32: the stored array, or a dequantized copy (new
        memory, rows*cols*4 bytes) of a matrix kept quantized. KeyError for unknown names."""
        if name not in self.weights:
            raise KeyError(f"{self.name} has no tensor {name!r}")
        return to_f32(self.weights[name])

    @property
    def packed_bytes(self) -> int:
        """Bytes of the low-precision weight panels built so far: 0 until the first bf16 or int8
        run; then bf16 adds about 2 bytes per weight of every matrix the forward multiplies by
        (the LM head included, also when tied to the embedding; panels are padded to 32
        outputs), e.g. ~270 MB for SmolLM2-135M, and int8 about 1.1-1.3 bytes per weight (the
        8-bit values plus a float scale, and an offset for Q4_1/Q5_1/K-quants, per 32). They
        live as long as the model."""
        return int(_core.model_packed_bytes(self._handle))

    @contextlib.contextmanager
    def using_precision(self, precision: str) -> Iterator["Model"]:
        """Within the ``with`` block, ``precision`` (``"fp32"``, ``"bf16"`` or ``"int8"``) is the
        model's default (:attr:`precision`); the previous default comes back on leaving it, also
        after an exception. E.g. the derivatives of a bf16 model: ``with m.using_precision("fp32"):
        m.vjp(...)``. Not for models shared between threads."""
        before, self.precision = self.precision, check_precision(precision)
        try:
            yield self
        finally:
            self.precision = before

    def _fp32_only(self, what: str, precision: Optional[str]) -> None:
        """Derivatives run in fp32 only for now: a bf16 or int8 request (or such a model
        default) is an error, never silently fp32."""
        p = self.precision if precision is None else check_precision(precision)
        if p != "fp32":
            raise ValueError(f"{what} is available in fp32 only: precision={p!r} applies to the forward "
                             f"(Model.run) so far; pass precision='fp32' to compute it in fp32")

    @property
    def has_lm_head(self) -> bool:
        """False for encoders (BERT): no logits."""
        return self.config.has_lm_head

    def __repr__(self) -> str:
        c = self.config
        kinds = sorted({w.type_name for w in self.weights.values() if isinstance(w, QuantizedTensor)})
        enc = f", {'/'.join(kinds)} matrices" if kinds else ""
        return (f"<sinklab.Model {self.name}: {c.arch} ({c.family} family), {c.n_layers} layers x "
                f"{c.n_heads} heads ({c.n_kv_heads} kv), d={c.d_model}, vocab={c.vocab_size}{enc}>")

    # ------------------------------------------------------------------ tokens
    def bos_id(self, bos: bool = True) -> Optional[int]:
        """The BOS token id to prepend when ``bos`` is true (None when false); ValueError if the model has none."""
        if not bos:
            return None
        if self.config.bos_token_id is None:
            raise ValueError(f"{self.name} has no BOS token; use bos=False")
        return int(self.config.bos_token_id)

    def tokenize(self, text: str, bos: bool = False) -> np.ndarray:
        """Token ids (T,) int64 of ``text``; ``bos=True`` prepends the model's BOS token."""
        if self.tokenizer is None:
            raise ValueError(f"{self.source} carries no tokenizer; pass token ids to run() instead")
        return self.tokenizer.encode(text, bos=bos)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def token_text(self, token_id: Optional[int]) -> Optional[str]:
        """The text of one token (special tokens written out, ``"<bos>"``), for labels; None
        when ``token_id`` is None or the model carries no tokenizer."""
        if token_id is None or self.tokenizer is None:
            return None
        return self.tokenizer.decode([int(token_id)])

    # ------------------------------------------------------------------ forward
    def check_ids(self, ids: Any) -> np.ndarray:
        """``ids`` as a C-contiguous int64 array of shape (T,) or (B, T), or a ValueError/TypeError naming the problem."""
        if isinstance(ids, (str, bytes)):
            raise TypeError("run() takes token ids, not text: call model.tokenize(text, bos=...) first (or "
                            "sinklab.inputs.prepare for the model's own ⟨bos⟩ rule)")
        try:
            arr = np.asarray(ids)
        except ValueError as e:             # NumPy refuses rows of unequal lengths
            raise ValueError("token ids are ragged (rows of unequal lengths): pad them to one length T and pass "
                             "lengths=[each row's length], or batch them with sinklab.batching (ragged=True)") from e
        if arr.ndim not in (1, 2):
            raise ValueError(f"token ids must have shape (T,) or (B, T), got {arr.shape}")
        if arr.size == 0:
            raise ValueError("token ids are empty: need at least one token")
        if not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
        T, ctx = arr.shape[-1], self.config.context_length
        if T > ctx:
            raise ValueError(f"sequence of {T} tokens exceeds the model's context length {ctx}")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        return np.ascontiguousarray(arr, dtype=np.int64)

    def check_layers(self, layers: Optional[Sequence[int]]) -> List[int]:
        """The blocks a per-layer capture of :meth:`run` takes: ``layers`` sorted without repeats
        (default all, 0..L-1); ValueError naming any index outside [0, L)."""
        L = self.config.n_layers
        if layers is None:
            return list(range(L))
        out = sorted({int(l) for l in layers})
        bad = [l for l in out if not 0 <= l < L]
        if bad:
            raise ValueError(f"layers {bad} out of range for a model with {L} layers")
        return out

    def check_resid_layers(self, layers: Optional[Sequence[int]], top: int, sort: bool = False) -> List[int]:
        """Residual-stream indices l in [0, ``top``] whose gradients a backward from ``resid[top]``
        returns: ``layers`` as given (sorted without repeats when ``sort``), default 0..top;
        ValueError naming any index outside [0, top]."""
        if layers is None:
            return list(range(top + 1))
        out = sorted({int(l) for l in layers}) if sort else [int(l) for l in layers]
        bad = [l for l in out if not 0 <= l <= top]
        if bad:
            raise ValueError(f"layers {bad} outside [0, {top}]: gradients exist for resid[0..{top}]")
        return out

    def capture_bytes(self, T: int, capture: Union[str, Iterable[str]] = DEFAULT_CAPTURE,
                      layers: Optional[Sequence[int]] = None, logits_from: int = 0,
                      B: int = 1, logit_rows: Optional[int] = None) -> Dict[str, int]:
        """Bytes of the float32 buffers :meth:`run` allocates for ``B`` sequences of ``T`` tokens.

        One entry per requested capture, 4 bytes times B times the shape in the table of
        :meth:`run` (L' = number of captured layers): e.g. ``"attn"`` B*L'*H*T*T*4,
        ``"head_out"`` B*L'*H*T*d*4, ``"stats"`` 3*B*L'*H*T*4. ``logit_rows``: the number of
        ``logits_at`` positions per sequence, when the logits are taken only there.
        """
        if capture is DEFAULT_CAPTURE and not self.config.has_lm_head:
            capture = ("attn", "resid")
        names = normalize_capture(capture)
        self._check_head(names)
        shapes = buffer_shapes(self.config, T, len(self.check_layers(layers)), logits_from % max(T, 1), logit_rows)
        per = {capture_of(k): 0 for k in shapes}
        for k, shape in shapes.items():
            per[capture_of(k)] += int(np.prod(shape))
        return {k: 4 * B * per[k] for k in CAPTURES if k in names}

    def _check_memory(self, need: Dict[str, int], B: int, T: int, n_sel: int) -> None:
        """MemoryError before allocating when the capture buffers exceed the available memory."""
        total = sum(need.values())
        avail = available_memory()
        if avail is None or total <= avail:
            return
        c = self.config
        parts = ", ".join(f"{k} {_gb(v)}" for k, v in need.items())
        stats = 4 * B * 3 * n_sel * c.n_heads * T
        if "attn" in need:
            biggest = f"attn alone is B*L'*H*T*T*4 bytes = {B}*{n_sel}*{c.n_heads}*{T}^2*4"
        else:
            k = max(need, key=need.__getitem__)
            biggest = f"{k} alone is {_gb(need[k])}"
        # every capture but resid and logits scales with the number of captured layers
        one_layer = sum(v for k, v in need.items() if k not in ("resid", "logits")) // max(n_sel, 1)
        raise MemoryError(
            f"capture for {B} x {T} tokens needs {_gb(total)} ({parts}) but only {_gb(avail)} of memory "
            f"is available; {biggest}. Cheaper: "
            f"capture only some layers (layers=[...], {_gb(one_layer)} per layer), or "
            f"capture=\"stats\" (first-token importance, attention to position 0 and row entropy, "
            f"(L', H, T) each, {_gb(stats)} in all, no T x T buffer), or fewer tokens or sequences")

    def run(self, ids: Any, capture: Union[str, Iterable[str]] = DEFAULT_CAPTURE,
            layers: Optional[Sequence[int]] = None, intervene: Optional[Intervention] = None,
            logits_from: int = 0, progress: bool = True, lengths: Any = None,
            out: Optional[Trace] = None, max_rows: Optional[int] = None,
            key_start: Any = None, keep_first: Union[bool, int] = 0, precision: Optional[str] = None,
            window: Optional[int] = None, patch: Any = None, logits_at: Any = None) -> Trace:
        """Runs the forward pass and returns what ``capture`` asks for.

        Every capture is float32, copied out of the C forward as it computes the tensor (nothing
        is recomputed from weights). Shapes are for (T,) ids; (B, T) ids give every capture a
        leading B axis. L' = number of layers in ``layers``, H query heads, G kv heads, hd head
        dimension, d model width, V vocabulary.

        ============  ==================  ====================  ===========================================
        name          Trace attribute     shape                 what it is (TransformerLens hook)
        ============  ==================  ====================  ===========================================
        ``attn``      ``attn``            (L', H, T, T)         attention probabilities, rows sum to 1
                                                                (``hook_pattern``)
        ``stats``     ``stats``           3 x (L', H, T)        first-token importance, attention to
                                                                position 0, row entropy, computed without
                                                                a (T, T) buffer (:class:`AttentionStats`)
        ``resid``     ``resid``           (L+1, T, d)           stream entering each layer, ``resid[L]``
                                                                the last layer's output before the final
                                                                norm; always every layer (``layers=`` does
                                                                not apply) (``hook_resid_pre``)
        ``logits``    ``logits``          (T-logits_from, V)    output logits; (R, V) with ``logits_at``
        ``q``         ``q``               (L', H, T, hd)        queries after RoPE (``hook_rot_q``)
        ``k``         ``k``               (L', G, T, hd)        keys after RoPE, per kv head
                                                                (``hook_rot_k``)
        ``v``         ``v``               (L', G, T, hd)        values, per kv head (``hook_v``)
        ``z``         ``z``               (L', H, T, hd)        each head's attention output
                                                                sum_k A_ik v_k, after interventions and
                                                                ``head_scale``: what W_O reads
                                                                (``hook_z``)
        ``head_out``  ``head_out``        (L', H, T, d)         each head's addition to the residual
                                                                stream, z_h W_O[:, h]^T (``hook_result``)
        ``attn_out``  ``attn_out``        (L', T, d)            what the attention block adds to the
                                                                stream (``hook_attn_out``)
        ``mlp_out``   ``mlp_out``         (L', T, d)            what the MLP adds (``hook_mlp_out``)
        ============  ==================  ====================  ===========================================

        ``q`` and ``k`` are always in Hugging Face's rotate-half layout (RoPE pairs dimensions
        (i, i + hd/2)), also for GGUF files, whose Q/K rows llama.cpp stores permuted into
        interleaved pairs: the C core gathers them back, so captures from a GGUF file and from
        the same model's safetensors agree. TransformerLens orders axes (pos, head, d_head)
        where sinklab puts the head first. Query head h reads kv head h // (H/G).

        ``head_out`` costs H extra (T x hd)·(hd x d) products per captured layer (as many flops
        as the W_O product itself) and B*L'*H*T*d*4 bytes; ``head_out.sum(axis=head)`` equals
        ``attn_out`` to float32 rounding (the sum runs in another order), and
        ``resid[l+1] = resid[l] + attn_out[l] + mlp_out[l]`` likewise.

        A (B, T) batch runs in one C call per chunk of up to ``max_rows // T`` sequences: the
        real tokens of all its sequences go through every weight product together, while RoPE
        positions restart at 0 and attention stays inside each sequence, so every capture is
        bitwise what running that sequence alone gives.

        Args:
            ids: token ids, (T,) or (B, T), any integer array-like.
            capture: one name or an iterable of names from the table above.
            layers: layers whose per-layer captures (every row of the table except ``resid`` and
                ``logits``) are taken (default all); ``Trace.layers``.
            intervene: an :class:`Intervention` on the first token (mask it, zero its value, scale heads).
            logits_from: first position whose logits are computed (negative counts from the end:
                -1 gives only the last position's, which is all generation needs). With
                ``lengths`` it counts padded positions: row r is position logits_from + r of
                every sequence, zero where that is padding.
            logits_at: None, or the positions whose logits are computed, in the order given
                (repeats allowed; negative counts from the sequence's end, its ``lengths[b]``
                under ``lengths``): (R,) for every sequence, or (B, R), one row per sequence.
                ``logits`` is then (R, V) ((B, R, V)), row r the logits of position
                ``logits_at[r]``, bitwise the row ``logits_from`` would give; only those rows go
                through the output head (V * d multiply-adds each: for Gemma-3's 262,144-token
                vocabulary more than a whole layer per token). Exclusive with ``logits_from``;
                ``Trace.meta["logits_at"]`` holds the resolved positions.
            progress: show a progress bar over the chunks when there are several.
            lengths: None, or (B,) ints in [1, T] for a padded (B, T) batch: sequence b is its
                first ``lengths[b]`` ids and is computed exactly as if run alone; the padding ids
                after it are never read by the model but must still be valid ids (e.g. 0). Every
                capture is zero at positions >= lengths[b] (attention rows and columns too).
            out: a :class:`Trace` from an earlier run with the same capture, layers, ids shape
                and logits_from: its arrays are refilled in place and it is returned (ids,
                lengths and meta updated), so repeated runs reuse memory whose pages are
                already touched instead of allocating new buffers.
            max_rows: the most B*T token rows per C call (default :attr:`max_rows_per_call`).
            key_start: None, or (T,) ints: training's packing mask (intra-document attention),
                query i attends only to keys j >= key_start[i], the start of its document
                (nondecreasing, key_start[i] <= i; checked by the C core); the same for every
                sequence of a batch.
            keep_first: k >= 0, the first k positions stay visible to every query of every layer
                whatever hides them: a document start of ``key_start`` (a fixed ⟨bos⟩ in front
                of every window), ``window``, or a layer's own sliding window (Gemma 3's local
                layers). ``True``/``False`` mean 1/0. Under a window the k keys cost k extra
                columns per query, O(T·(w + k)) in all.
            window: None (each layer as the model defines it) or w >= 1: every layer's causal
                attention sees only its w most recent keys (i - w < j <= i, Hugging Face's
                sliding window); a layer whose own window is smaller (Gemma 3's local layers,
                512) keeps its own, so the override applies to the global layers and to local
                layers with a wider window. StreamingLLM's windowed attention with sink tokens is
                ``window=w, keep_first=k``. Encoders (bidirectional attention) refuse it.
            precision: ``"fp32"`` (exact), ``"bf16"`` or ``"int8"``; default the model's
                (:func:`load`). Both change the linear layers and the LM head only; attention
                scores and values, softmax, norms, the residual stream and statistics stay
                fp32. bf16 rounds each weight product's input rows and weights to bf16 and sums
                in fp32 (csrc/gemm_bf16.h). int8 uses each weight as 8-bit integers with a
                scale (and offset) per 32 inputs, exactly the file's own quants for
                Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K, requantized once for Q6_K and float
                weights, and quantizes each input row per 32 values to int8 (csrc/gemm_int8.h);
                a matrix whose width is not a multiple of 32 stays fp32. ``head_out`` is still
                an fp32 product of ``z`` with W_O, so it sums to ``attn_out`` only to that
                rounding. ``Trace.meta["precision"]`` records it.
            patch: None, a :class:`~sinklab.patching.Patch` or a list of them: arrays that replace
                or are added to ``resid``, ``attn_out``, ``mlp_out``, ``head_out``, ``z``, ``q``,
                ``k``, ``v`` or the attention ``pattern`` at chosen layers, rows, positions and
                heads, applied inside the C forward before the activation is captured or read
                (:mod:`sinklab.patching`); ``Trace.meta["patched"]`` counts them.

        Raises:
            ValueError: an unknown capture name, a layer out of range, bad ids, bad lengths,
                an ``out`` whose captures or shapes do not match (naming the field).
            MemoryError: before allocating anything, when the capture buffers
                (:meth:`capture_bytes`) exceed the available memory; the message names the size
                and the cheaper captures.
        """
        if capture is DEFAULT_CAPTURE and not self.config.has_lm_head:
            capture = ("attn", "resid")
        prec = self.precision if precision is None else check_precision(precision)
        capture = normalize_capture(capture)
        self._check_head(capture)
        arr = self.check_ids(ids)
        sel = self.check_layers(layers)
        batch = arr.reshape(-1, arr.shape[-1])
        B, T = batch.shape
        if not -T <= logits_from < T:
            raise ValueError(f"logits_from={logits_from} outside [-{T}, {T}) for T={T}")
        logits_from %= T
        lens = self._check_lengths(lengths, B, T, arr.ndim)
        at = None if logits_at is None else self._check_logits_at(logits_at, logits_from, B, T, lens, arr.ndim)
        ks = self._check_key_start(key_start, T)
        keep, win = self._check_window(keep_first, window)
        c = self.config
        ivs = core_arrays(intervene, c.n_layers, c.n_heads)
        patches = check_patches(patch)
        dims = patch_dims(c, "rope_inv_freq" in self.weights)
        rows = None if at is None else at.shape[1]
        shapes = buffer_shapes(c, T, len(sel), logits_from, rows)
        wanted = [k for k in shapes if capture_of(k) in capture]
        if out is not None:
            bufs = self._out_buffers(out, capture, wanted, shapes, sel, B, arr.ndim)
        else:
            self._check_memory(self.capture_bytes(T, capture, sel, logits_from, B, rows), B, T, len(sel))
            bufs = {k: np.empty((B,) + shapes[k], np.float32) for k in wanted}
        per_call = max(1, int(self.max_rows_per_call if max_rows is None else max_rows) // T)
        starts = range(0, B, per_call)
        bar = progress_bar(starts, progress and len(starts) > 1, desc=f"forward ({B} x {T} tokens)", unit="chunk")
        for b0 in bar:
            b1 = min(B, b0 + per_call)
            _core.model_forward(self._handle, batch[b0:b1], logits_from=logits_from, layers=sel,
                                lengths=None if lens is None else lens[b0:b1], key_start=ks,
                                keep_first=keep, window=win, precision=PRECISIONS[prec],
                                patch=chunk_patches(patches, dims, B, T, b0, b1) if patches else None,
                                logits_at=None if at is None else at[b0:b1],
                                **{k: v[b0:b1] for k, v in bufs.items()}, **ivs)
        squeeze = (lambda x: x[0]) if arr.ndim == 1 else (lambda x: x)
        get = lambda k: squeeze(bufs[k]) if k in bufs else None  # noqa: E731
        bos = c.bos_token_id
        meta = {"model": self.name, "source": self.source, "bos_token_id": bos,
                "starts_with_bos": bool(bos is not None and np.all(batch[:, 0] == bos)),
                "logits_from": logits_from, "intervention": {k: v is not None for k, v in ivs.items()},
                "precision": prec, "patched": len(patches)}
        if at is not None:
            meta["logits_at"] = squeeze(at).tolist()      # JSON-able: Trace.save writes meta as JSON
        st = None
        if "stats" in capture:
            st = AttentionStats(**{k: get(k) for k in STATS})  # type: ignore[arg-type]  # captured: not None
        fields: Dict[str, Any] = dict(ids=arr, attn=get("attn"), resid=get("resid"), logits=get("logits"), stats=st,
                      layers=sel, meta=meta, lengths=lens, **{k: get(k) for k in ACTIVATIONS})
        decode = None if self.tokenizer is None else self.tokenizer.decode
        if out is None:
            return Trace(**fields, decode=decode)
        # the arrays were refilled in place; only what describes the run changes
        out.ids, out.layers, out.meta, out.lengths, out.decode = arr, sel, meta, lens, decode
        out.token_texts = None                         # the texts of an earlier run no longer apply
        return out

    def _check_head(self, capture: Iterable[str]) -> None:
        if "logits" in capture and not self.config.has_lm_head:
            raise ValueError(f"{self.name} ({self.config.arch}) has no LM head, so no logits: capture "
                             f"the residual stream, attention or stats instead (capture={list(capture)})")

    def _check_lengths(self, lengths: Any, B: int, T: int, ndim: int) -> Optional[np.ndarray]:
        """``lengths`` as a (B,) int64 array in [1, T], or None when absent or all equal T."""
        if lengths is None:
            return None
        ln = np.asarray(lengths)
        if ndim == 1 and ln.ndim == 0:
            ln = ln.reshape(1)
        if ln.shape != (B,) or not np.issubdtype(ln.dtype, np.integer):
            raise ValueError(f"lengths must be {B} integers (one per sequence), got {ln.dtype} {ln.shape}")
        bad = np.flatnonzero((ln < 1) | (ln > T))
        if bad.size:
            raise ValueError(f"lengths[{int(bad[0])}]={int(ln[bad[0]])} outside [1, {T}] (T={T})")
        return None if np.all(ln == T) else np.ascontiguousarray(ln, dtype=np.int64)

    @staticmethod
    def _check_logits_at(logits_at: Any, logits_from: int, B: int, T: int, lens: Optional[np.ndarray],
                         ndim: int) -> np.ndarray:
        """``logits_at`` as a (B, R) int64 array of positions inside each sequence (negative ones
        counted from its end); ValueError naming the problem."""
        if logits_from != 0:
            raise ValueError(f"logits_at and logits_from={logits_from} are exclusive: give one")
        at = np.asarray(logits_at)
        one = at.ndim == 1
        if at.size == 0 or not np.issubdtype(at.dtype, np.integer) or at.ndim not in (1, 2):
            raise ValueError(f"logits_at must be a non-empty (R,) or (B, R) array of integer positions, "
                             f"got {at.dtype} {at.shape}")
        if at.ndim == 2 and (ndim == 1 or at.shape[0] != B):
            raise ValueError(f"logits_at has shape {at.shape}: for ids of shape {(B, T) if ndim == 2 else (T,)} "
                             f"give (R,) positions{f' or ({B}, R), a row per sequence' if ndim == 2 else ''}")
        at = np.broadcast_to(at.astype(np.int64), (B, at.shape[-1]))
        n = np.full((B, 1), T, np.int64) if lens is None else lens.astype(np.int64)[:, None]
        bad = np.argwhere((at < -n) | (at >= n))
        if bad.size:
            b, r = (int(x) for x in bad[0])
            raise ValueError(f"logits_at[{r if one else f'{b}, {r}'}]={int(at[b, r])} outside [-{int(n[b, 0])}, {int(n[b, 0])}) "
                             f"for sequence {b} of {int(n[b, 0])} tokens")
        return np.ascontiguousarray(np.where(at < 0, at + n, at))

    def _check_window(self, keep_first: Any, window: Any) -> Tuple[int, int]:
        """``keep_first`` as a count and ``window`` as an int (0: none), each checked."""
        if isinstance(keep_first, (bool, np.bool_)):
            keep = int(keep_first)
        elif isinstance(keep_first, (int, np.integer)) and keep_first >= 0:
            keep = int(keep_first)
        else:
            raise ValueError(f"keep_first must be a bool or a count >= 0 of first positions, got {keep_first!r}")
        if keep > 2**31 - 1:
            raise ValueError(f"keep_first={keep} is too large")
        if window is None:
            return keep, 0
        if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be None or an int >= 1 (keys per query), got {window!r}")
        if self.config.bidirectional:
            raise ValueError("window: the model has bidirectional attention (an encoder); a sliding window "
                             "is defined for causal attention only")
        return keep, int(window)

    @staticmethod
    def _check_key_start(key_start: Any, T: int) -> Optional[np.ndarray]:
        """``key_start`` as a (T,) int64 array, or None; its values are the core's to check."""
        if key_start is None:
            return None
        ks = np.asarray(key_start)
        if ks.shape != (T,) or not np.issubdtype(ks.dtype, np.integer):
            raise ValueError(f"key_start must be {T} integers (one document start per position), "
                             f"got {ks.dtype} {ks.shape}")
        return np.ascontiguousarray(ks, dtype=np.int64)

    @staticmethod
    def _out_buffers(out: Trace, capture: Tuple[str, ...], wanted: List[str], shapes: Dict[str, tuple],
                     sel: List[int], B: int, ndim: int) -> Dict[str, np.ndarray]:
        """The arrays of ``out`` to refill, each checked against the shape a fresh run would give
        (with a leading B axis, as the C core writes them); ValueError naming any mismatch."""
        if not isinstance(out, Trace):
            raise ValueError(f"out must be a Trace from an earlier run, got {type(out).__name__}")
        if list(out.layers) != list(sel):
            raise ValueError(f"out.layers {list(out.layers)} differ from the layers of this run {sel}")
        have = {k for k in CAPTURES if k != "stats" and getattr(out, k) is not None}
        if out.stats is not None:
            have.add("stats")
        extra = sorted(have - set(capture))
        if extra:
            raise ValueError(f"out holds captures {extra} that this run does not ask for (capture={list(capture)})")
        bufs = {}
        for k in wanted:
            a = getattr(out.stats, k, None) if k in STATS else getattr(out, k)
            name = f"stats.{k}" if k in STATS else k
            want = ((B,) if ndim == 2 else ()) + shapes[k]
            if a is None:
                raise ValueError(f"out.{name} is None but this run captures it (shape {want})")
            if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != want:
                got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"out.{name} is {got}, expected float32 {want}")
            if not (a.flags.c_contiguous and a.flags.writeable):
                raise ValueError(f"out.{name} must be a C-contiguous writeable array")
            bufs[k] = a if ndim == 2 else a[None]
        return bufs

    # ------------------------------------------------------------------ derivatives
    def check_sequence(self, ids: Any) -> np.ndarray:
        """``ids`` as :meth:`check_ids` gives them, and one sequence (T,): what the derivatives
        take; ValueError for (B, T) ids."""
        arr = self.check_ids(ids)
        if arr.ndim != 1:
            raise ValueError(f"derivatives take one sequence of ids (T,), got shape {arr.shape}")
        return arr

    def _directions(self, x: Any, shape: Tuple[int, ...], name: str) -> Tuple[np.ndarray, bool]:
        """``x`` as float32 with shape ``shape`` or ``(B,) + shape``; returns (array (B,) + shape, batched)."""
        arr = np.asarray(x)
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise TypeError(f"{name} must be a float array, got dtype {arr.dtype}")
        if arr.shape == shape:
            out, batched = arr[None], False
        elif arr.ndim == len(shape) + 1 and arr.shape[1:] == shape and arr.shape[0] >= 1:
            out, batched = arr, True
        else:
            raise ValueError(f"{name} must have shape {shape} or (B,) + {shape}, got {arr.shape}")
        with np.errstate(over="ignore"):  # an overflow to inf is reported below, by index
            out = np.ascontiguousarray(out, dtype=np.float32)
        finite = np.isfinite(out)
        if not finite.all():  # a NaN or inf would spread through every later position: refuse it by name
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            bad = first if batched else first[1:]            # the index in the caller's array
            kind = "NaN" if np.isnan(out[first]) else "inf"
            big = " (a finite value too large for float32)" if np.isfinite(arr[bad]) else ""
            raise ValueError(f"{name} holds {kind}{big} at index {bad} ({int((~finite).sum())} non-finite "
                             f"values); directions must be finite")
        return out, batched

    def layer_index(self, layer: Any, name: str, lo: int = 0) -> int:
        """``layer`` as an int resid index in [``lo``, L]; TypeError for a non-integer,
        ValueError (naming the argument ``name``) outside the range."""
        L = self.config.n_layers
        if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"{name} must be an integer layer index, got {layer!r}")
        if not lo <= int(layer) <= L:
            raise ValueError(f"{name}={layer} outside [{lo}, {L}] (resid[{L}] is the last layer's output)")
        return int(layer)

    @staticmethod
    def positions(positions: Any, T: int) -> np.ndarray:
        """``positions`` (an int, a sequence of distinct ints, or None for all T) as an int array
        in [0, T), negatives counted from the end; ValueError when out of range or repeated."""
        pos = np.asarray(range(T) if positions is None else positions)
        if pos.ndim > 1 or not np.issubdtype(pos.dtype, np.integer):
            raise ValueError(f"positions must be an integer or a sequence of integers, got {positions!r}")
        pos = pos.reshape(-1)
        bad = pos[(pos < -T) | (pos >= T)]
        if bad.size:
            raise ValueError(f"position {int(bad[0])} outside [-{T}, {T}) for T={T}")
        pos = pos % T
        if len(np.unique(pos)) != len(pos):
            raise ValueError(f"positions repeat: {positions!r}")
        return pos

    def check_bytes(self, nbytes: int, what: str, cheaper: str) -> None:
        """MemoryError naming ``what``, its size and the ``cheaper`` way when ``nbytes`` bytes
        exceed the available memory (no check when that cannot be told)."""
        avail = available_memory()
        if avail is not None and nbytes > avail:
            raise MemoryError(f"{what} needs {_gb(nbytes)} but only {_gb(avail)} is available; {cheaper}")

    @property
    def max_rows_per_call(self) -> int:
        """Token rows per forward call by default: MAX_ROWS_PER_CALL, fewer for models whose
        activations take more than WORKSPACE_BYTES at that many rows (the C core's count of the
        workspace per packed row, ``_core.model_forward_floats``: rows x (2d + 2H*hd + 3G*hd +
        2F + hd + 8H) floats)."""
        per_row = 4 * _core.model_forward_floats(self._handle, 1)
        return max(1, min(MAX_ROWS_PER_CALL, WORKSPACE_BYTES // per_row))

    def grad_bytes(self, T: int, B: int = 1, n_tape: Optional[int] = None) -> int:
        """Bytes the C backward allocates for ``B`` directions on ``T`` tokens (besides the outputs),
        as the C core sizes them (``_core.model_grad_floats``).

        The tape of ``n_tape`` layers (default all; LLaMA: 4*(4d + 2H*hd + 2G*hd + 2F + 2) bytes
        per token and layer; QK-norms, post-norms and LayerNorm statistics add to it); the
        layer's attention probabilities 4*H*T*T and MLP partials 4*2*T*F; per direction and
        token 4*(2d + 2H*hd + 2G*hd) bytes (+ 4*2H*hd with grouped kv heads, + 4*H*hd with
        QK-norms, + 4*d with post-norms), and the MLP's 3 F-wide buffers for up to 8192 rows.
        """
        return 4 * _core.model_grad_floats(self._handle, int(T), int(B),
                                           None if n_tape is None else int(n_tape))

    def vjp(self, ids: Any, cotangent: Any, at: Any, intervene: Optional[Intervention] = None,
            layers: Optional[Sequence[int]] = None, precision: Optional[str] = None,
            patch: Any = None) -> np.ndarray:
        """Vector-Jacobian product: gradients of ``<cotangent, resid[layer][positions]>`` with
        respect to the residual stream entering each layer.

        ``resid[l]`` is the stream entering layer l (``resid[0]`` the input embeddings,
        ``resid[L]`` the last layer's output before the final norm), as :meth:`run` captures it.
        The C backward runs one forward (saving each layer's activations), then pushes all B
        cotangents back together, so each linear layer's backward is one product with B*T rows.
        In a causal model, positions after the last one in ``positions`` cannot influence it: they
        are not computed and their gradients are exactly zero (an encoder runs every position).

        Args:
            ids: token ids (T,).
            cotangent: (P, d), or (B, P, d) for B cotangents at once; (d,) / (B, d) when
                ``positions`` is one integer; finite (NaN or inf is a ValueError naming its index).
            at: ``(layer, positions)`` with ``layer`` in [0, L] and ``positions`` an int or a
                sequence of P distinct ints (negative count from the end); a bare ``layer``
                means every position.
            intervene: an :class:`Intervention`, differentiated as applied.
            layers: which ``resid[l]`` (l <= layer) to return gradients for; default all 0..layer.
            patch: patches (:class:`~sinklab.patching.Patch`) applied in the forward (as in :meth:`run`;
                rows None or [0]), differentiated as applied: a ``"replace"`` patch's entries are
                constants, so no gradient flows through them (the gradient w.r.t. a replaced
                ``resid[l]`` entry is returned, but nothing below it receives any; a replaced
                ``pattern`` row passes gradient to V only, not to q and k); an ``"add"`` patch
                passes gradients through. A pattern patch may not put weight on keys after the
                output position (they are not run).

        Returns:
            float32 (n, T, d), or (B, n, T, d) for batched cotangents, n = len(layers): row k is
            the gradient with respect to ``resid[layers[k]]``.
        """
        self._fp32_only("Model.vjp", precision)
        arr = self.check_sequence(ids)
        T, d = arr.shape[0], self.config.d_model
        layer, positions = at if isinstance(at, tuple) else (at, None)
        layer = self.layer_index(layer, "at layer")
        pos = self.positions(positions, T)
        one = positions is not None and np.ndim(positions) == 0
        cot, batched = self._directions(cotangent, (d,) if one else (len(pos), d), "cotangent")
        cot = cot.reshape(cot.shape[0], len(pos), d)
        out_layers = self.check_resid_layers(layers, layer)
        B, t_eff = cot.shape[0], self.influence_end(int(pos.max()), T)
        self.check_bytes(self.grad_bytes(t_eff, B, layer) + 4 * B * len(out_layers) * T * d,
                          f"vjp of {B} cotangents on {T} tokens", "pass fewer cotangents at once or fewer layers=")
        full = np.zeros((B, t_eff, d), np.float32)
        full[:, pos] = cot
        out = np.zeros((B, len(out_layers), T, d), np.float32)
        bufs: List[Optional[np.ndarray]] = [None] * (self.config.n_layers + 1)
        for l in out_layers:  # the C core writes (B, t_eff, d) C-contiguous blocks
            bufs[l] = np.empty((B, t_eff, d), np.float32)
        ivs = core_arrays(intervene, self.config.n_layers, self.config.n_heads)
        pt = derivative_patches(check_patches(patch), patch_dims(self.config, "rope_inv_freq" in self.weights), T, t_eff)
        _core.model_vjp(self._handle, np.ascontiguousarray(arr[:t_eff]), full, layer, dresid=bufs, patch=pt, **ivs)
        for k, l in enumerate(out_layers):
            out[:, k, :t_eff] = bufs[l]
        return out if batched else out[0]

    def vjp_norms(self, ids: Any, cotangent: Any, at: Tuple[int, int], layers: Optional[Sequence[int]] = None,
                  spectral: bool = False, spectral_rtol: float = 1e-9,
                  intervene: Optional[Intervention] = None, precision: Optional[str] = None) -> "VjpNorms":
        """Norms of the vector-Jacobian products of :meth:`vjp`, per source position, without
        the (B, n, T, d) gradients: the C backward reduces each block as it computes it.

        For B cotangents u_b at one position p of ``resid[layer]`` and each returned layer l, the
        squared norm ``||u_b^T d resid[layer][p] / d resid[l][j]||^2`` of every source position j;
        with ``spectral``, the largest singular value of each (B, d) block of those B
        products, by Lanczos iteration on its Gram matrix until the Ritz value changes by less
        than ``spectral_rtol`` (relative; at most 300 steps): with the d unit vectors as
        cotangents, the spectral norm of the d x d Jacobian block
        ``d resid[layer][p] / d resid[l][j]``. Only sources j < t are returned, t = :meth:`influence_end` (p + 1 in a
        causal model, whose later positions cannot influence p; T in an encoder).

        Args:
            ids: token ids (T,).
            cotangent: (B, d) float (or one (d,)), finite (NaN or inf is a ValueError).
            at: ``(layer, position)``: ``layer`` in [1, L], ``position`` in [-T, T).
            layers: resid indices l in [0, layer], sorted without repeats (default 0..layer).
            spectral: also compute the spectral norms (needs B == d).
            spectral_rtol: the Lanczos stopping tolerance.
            intervene: an :class:`Intervention`, differentiated as applied.

        Returns:
            :class:`VjpNorms`: ``sq`` (n, B, t) float64, ``spectral`` (n, t) float64 or None,
            ``layers`` (n,), ``iters`` the most Lanczos steps any block took.
        """
        self._fp32_only("Model.vjp_norms", precision)
        arr = self.check_sequence(ids)
        T, d = arr.shape[0], self.config.d_model
        layer, position = at
        layer = self.layer_index(layer, "at layer", lo=1)
        pos = int(self.positions(position, T)[0])
        cot, _ = self._directions(cotangent, (d,), "cotangent")   # (B, d), also for one (d,)
        B, t_eff = cot.shape[0], self.influence_end(pos, T)
        sel = self.check_resid_layers(layers, layer, sort=True)
        self.check_bytes(self.grad_bytes(t_eff, B, layer) + 8 * len(sel) * (B + 1) * t_eff,
                         f"vjp_norms of {B} cotangents on {t_eff} tokens", "pass fewer cotangents at once")
        full = np.zeros((B, t_eff, d), np.float32)
        full[:, pos] = cot
        # the core writes each layer's (B, t) block straight into its row of the result
        sq = np.empty((len(sel), B, t_eff))
        spec = np.empty((len(sel), t_eff)) if spectral else None
        n_buf = self.config.n_layers + 1                      # the core takes L + 1 entries
        sq_bufs: List[Optional[np.ndarray]] = [None] * n_buf
        spec_bufs: List[Optional[np.ndarray]] = [None] * n_buf
        for k, l in enumerate(sel):
            sq_bufs[l] = sq[k]
            if spec is not None:
                spec_bufs[l] = spec[k]
        ivs = core_arrays(intervene, self.config.n_layers, self.config.n_heads)
        iters = _core.model_vjp(self._handle, np.ascontiguousarray(arr[:t_eff]), full, layer, sqnorm=sq_bufs,
                                spectral=spec_bufs if spectral else None, spectral_rtol=float(spectral_rtol), **ivs)
        return VjpNorms(sq=sq, spectral=spec, layers=sel, iters=int(iters))

    def jvp(self, ids: Any, tangent: Any, at: Any, intervene: Optional[Intervention] = None,
            precision: Optional[str] = None, patch: Any = None) -> np.ndarray:
        """Jacobian-vector product: how the residual stream of every later layer moves when
        ``resid[at]`` moves along ``tangent``, at the cost of about one forward per tangent.

        Args:
            ids: token ids (T,).
            tangent: (T, d) direction added to ``resid[at]``, or (B, T, d) for B at once;
                finite (NaN or inf is a ValueError naming its index).
            at: the layer index l in [0, L] of the stream the tangent enters.
            intervene: an :class:`Intervention`, differentiated as applied.
            patch: patches as in :meth:`vjp`: a replaced entry has no tangent (a replaced
                ``resid[l]`` entry's tangent is 0 for l > at), an added one passes it on.

        Returns:
            float32 (L+1-at, T, d), or (B, L+1-at, T, d): row k is the tangent of ``resid[at+k]``
            (row 0 is ``tangent`` itself).
        """
        self._fp32_only("Model.jvp", precision)
        arr = self.check_sequence(ids)
        T, d, L = arr.shape[0], self.config.d_model, self.config.n_layers
        at = self.layer_index(at, "at")
        tan, batched = self._directions(tangent, (T, d), "tangent")
        B = tan.shape[0]
        self.check_bytes(self.grad_bytes(T, B) + 4 * B * (L + 1 - at) * T * d,
                          f"jvp of {B} tangents on {T} tokens", "pass fewer tangents at once")
        out = np.empty((B, L + 1 - at, T, d), np.float32)
        bufs: List[Optional[np.ndarray]] = [None] * at + [np.ascontiguousarray(out[:, k]) for k in range(L + 1 - at)]
        ivs = core_arrays(intervene, L, self.config.n_heads)
        pt = derivative_patches(check_patches(patch), patch_dims(self.config, "rope_inv_freq" in self.weights), T, T)
        _core.model_jvp(self._handle, arr, tan, at, tout=bufs, patch=pt, **ivs)
        for k in range(L + 1 - at):
            out[:, k] = bufs[at + k]
        return out if batched else out[0]

    def jacobian(self, ids: Any, of: Tuple[int, int], wrt: int = 0, intervene: Optional[Intervention] = None,
                 progress: bool = True, chunk: Optional[int] = None, precision: Optional[str] = None,
                 patch: Any = None) -> np.ndarray:
        """The exact Jacobian block ``J[a, j, b] = d resid[layer][position, a] / d resid[wrt][j, b]``.

        Computed as d unit cotangents pushed back through the C backward together (one product
        with d*T rows per linear layer), in chunks of ``chunk`` cotangents when memory is short.

        Args:
            ids: token ids (T,).
            of: ``(layer, position)``, the output row; layer in [1, L].
            wrt: the layer whose input stream it is differentiated by, 0 <= wrt < layer.
            chunk: cotangents per backward call (default: all d when they fit in memory).
            patch: patches as in :meth:`vjp`, differentiated as applied.

        Returns:
            float32 (d, T, d); in a causal model rows j > position are zero.
        """
        self._fp32_only("Model.jacobian", precision)
        arr = self.check_sequence(ids)
        T, d = arr.shape[0], self.config.d_model
        layer, position = of
        layer = self.layer_index(layer, "of layer", lo=1)
        wrt = self.layer_index(wrt, "wrt")
        if wrt >= layer:
            raise ValueError(f"wrt={wrt} must be below the output layer {layer}")
        pos = int(self.positions(position, T)[0])
        chunk = self.cotangent_chunk(self.influence_end(pos, T), d, layer) if chunk is None else max(1, int(chunk))
        J = np.empty((d, T, d), np.float32)
        starts = range(0, d, chunk)
        for a0 in progress_bar(starts, progress and len(starts) > 1, desc=f"jacobian ({d} cotangents)", unit="chunk"):
            n = min(chunk, d - a0)
            cot = np.zeros((n, d), np.float32)
            cot[np.arange(n), a0 + np.arange(n)] = 1.0
            J[a0:a0 + n] = self.vjp(arr, cot, at=(layer, pos), intervene=intervene, layers=[wrt],
                                   precision="fp32", patch=patch)[:, 0]
        return J

    def influence_end(self, position: int, T: int) -> int:
        """One past the last position that can influence ``position``'s output: position + 1 in a
        causal model, T in a bidirectional encoder."""
        return T if self.config.bidirectional else position + 1

    def cotangent_chunk(self, T: int, B: int, n_tape: int, budget: Optional[int] = None) -> int:
        """The most cotangents (<= B) whose backward on ``T`` tokens through ``n_tape`` layers
        fits in ``budget`` bytes (default: half the available memory, at most 4 GB); >= 1."""
        avail = available_memory()
        budget = budget or min(4 << 30, (avail or 8 << 30) // 2)
        per = self.grad_bytes(T, 2, n_tape) - self.grad_bytes(T, 1, n_tape) + 4 * T * self.config.d_model
        fixed = self.grad_bytes(T, 1, n_tape) - per
        return int(max(1, min(B, (budget - fixed) // max(per, 1))))

    def loss_and_grad(self, ids: Any, targets: Any = None, intervene: Optional[Intervention] = None,
                      precision: Optional[str] = None) -> Tuple[float, Dict[str, np.ndarray]]:
        """Next-token cross-entropy and its gradient with respect to every weight.

        Args:
            ids: token ids (T,).
            targets: (T,) int target ids, negative to leave a position out; default the next
                token (``targets[t] = ids[t+1]``, the last position left out), so the loss is
                what Hugging Face's ``labels=ids`` computes.
            intervene: an :class:`Intervention`, differentiated as applied.

        Returns:
            (loss, grads): the mean cross-entropy in nats over the positions with a target, and
            float32 gradients keyed and shaped like :attr:`weights` (without ``rope_inv_freq``;
            with tied embeddings there is no ``lm_head`` entry and ``tok_embd`` holds the sum of
            the embedding's and the head's gradients). Q/K gradients of a GGUF-loaded model are
            in the file's (llama.cpp-permuted) row layout, like its weights.
        """
        self._fp32_only("Model.loss_and_grad", precision)
        arr = self.check_sequence(ids)
        T = arr.shape[0]
        if targets is None:
            tg = np.full(T, -1, np.int64)
            tg[:-1] = arr[1:]
        else:
            tg = np.asarray(targets)
            if tg.shape != (T,) or not np.issubdtype(tg.dtype, np.integer):
                raise ValueError(f"targets must be integers of shape ({T},), got {tg.dtype} {tg.shape}")
            if tg.max() >= self.config.vocab_size:
                raise ValueError(f"target {int(tg.max())} is outside the vocabulary [0, {self.config.vocab_size})")
            tg = np.ascontiguousarray(tg, dtype=np.int64)
        if not np.any(tg >= 0):
            raise ValueError("no position has a target: need T >= 2 or some targets >= 0")
        self._check_head(("logits",))
        tied = self.weights.get("lm_head") is self.weights["tok_embd"]
        shapes = {k: tuple(v.shape) for k, v in self.weights.items()
                  if k != "rope_inv_freq" and not (tied and k == "lm_head")}
        grad_floats = sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values())
        self.check_bytes(self.grad_bytes(T) + 4 * (grad_floats + T * self.config.vocab_size),
                          f"loss_and_grad on {T} tokens (every layer's saved activations, one layer's "
                          f"T x T attention, the logits and {grad_floats:,} gradient floats)",
                          "use fewer tokens: the attention part grows as T^2")
        grads = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
        bufs = dict(grads, lm_head=grads["tok_embd"]) if tied else grads
        ivs = core_arrays(intervene, self.config.n_layers, self.config.n_heads)
        loss = _core.model_loss_grad(self._handle, arr, tg, bufs, **ivs)
        return float(loss), grads


def load(name_or_path: Union[str, os.PathLike], quiet: bool = False, precision: str = "fp32",
         revision: Optional[str] = None, filename: Optional[str] = None) -> Model:
    """Loads a model: a registered name (``"smollm2-135m-instruct"``), a Hugging Face repo id
    (``"HuggingFaceTB/SmolLM2-135M-Instruct"``, at ``revision=`` if given; ``filename=`` picks the
    file of a GGUF repo), a ``.gguf`` file, or a Hugging Face folder with ``config.json`` and
    ``*.safetensors``, of any supported family
    (:data:`sinklab.families.SUPPORTED_HF_TYPES`, :data:`~sinklab.families.SUPPORTED_GGUF_ARCHS`;
    another architecture raises ValueError naming itself and the supported list). GGUF
    matrices stay quantized in memory (memory-mapped), F16/BF16 ones half-width.

    ``precision`` is the default of :meth:`Model.run` (each call may override it): ``"fp32"``
    (exact, the default), ``"bf16"`` (weight products in bf16 with fp32 sums) or ``"int8"``
    (weights as int8 with per-block scales, activations quantized per row); the documentation's
    docs/guides/precision.md says what each costs in fidelity. Panels of the weights are built at
    the first such run and kept with the model (:attr:`Model.packed_bytes`). The derivatives
    (vjp, jvp, jacobian, loss_and_grad) are fp32 only for now and raise ValueError on a bf16 or
    int8 model unless called with ``precision="fp32"``.

    A repo id is resolved through huggingface_hub into the Hugging Face cache (``HF_HOME``,
    ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` reads only the cache; :mod:`sinklab.io.hub`), with its
    download progress; the model is named by its repo id, also when loaded from a path inside
    that cache."""
    precision = check_precision(precision)
    src = os.fspath(name_or_path)
    name = None
    if not os.path.exists(src) and registry.is_registered(src):
        name = registry.resolve_name(src).name
        src = str(registry.fetch(src, quiet=quiet))
    elif hub.is_repo_id(src):
        name = src if filename is None else f"{src}:{filename}"
        src = str(hub.resolve(src, revision=revision, filename=filename, quiet=quiet))
    if (revision is not None or filename is not None) and name is None:
        raise ValueError(f"revision= and filename= are for a Hugging Face repo id ('org/name'), not {src!r}")
    name = name or hub.repo_id_of_path(src)
    if os.path.isdir(src):
        cfg = hf_loader.read_config(src)
        weights = hf_loader.load_hf_weights(src, cfg)
        tok = Tokenizer.from_hf_dir(src) if os.path.isfile(os.path.join(src, "tokenizer.json")) else None
        return Model(cfg, weights, tok, src, hf_loader.rope_layout(cfg), name=name, precision=precision)
    if os.path.isfile(src):
        reader = gguf_loader.open_gguf(src)
        cfg = gguf_loader.read_config(reader)
        weights = gguf_loader.load_gguf_weights(reader, cfg)
        factors = gguf_loader.llama3_rope_factors(reader, cfg) if cfg.positions == "rope" else None
        tok = Tokenizer.from_gguf(reader) if "tokenizer.ggml.tokens" in reader.fields else None
        return Model(cfg, weights, tok, src, gguf_loader.rope_layout(cfg), rope_factors=factors, name=name,
                     precision=precision)
    raise FileNotFoundError(f"{src!r} is neither a file, a folder, nor a registered model name "
                            f"({', '.join(sorted(registry.MODELS))})")
