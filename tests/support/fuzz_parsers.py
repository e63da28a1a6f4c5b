"""Seeded mutation fuzzing of sinklab's file parsers: every hostile input must end in a
documented exception, never a crash, another exception type, a hang or a huge allocation.

    python benchmarks/fuzz_parsers.py --parser all --n 100000 --seed 0
    python benchmarks/fuzz_parsers.py --parser gguf --n 2000 --seed 1 --out /tmp/fuzz

Parsers (what runs on each input, and the exception types it documents, :data:`DOCUMENTED`):

``gguf``
    :func:`sinklab.io.gguf_loader.open_gguf` (what ``sinklab.load`` calls) on the file, then
    every tensor's bytes are touched and ``read_config`` reads the model's shape. Documented: ``GGUFError`` / ``GGUFFormatError`` (ValueError).
``safetensors``
    :func:`sinklab.io.hf_loader.read_safetensors`, then every F32/F16/BF16 tensor is decoded with
    ``to_f32``. Documented: ``SafetensorsError`` (ValueError).
``tokenizer``
    :meth:`sinklab.tokenizer.Tokenizer.from_gguf` on a mutated GGUF file, or on mutated metadata
    values (``_from_gguf_metadata``), then a short text is encoded and decoded. Documented:
    ``ValueError`` (which ``GGUFError`` is).
``checkpoint``
    :func:`sinklab.train.checkpoint.load_checkpoint` on a copy of a tiny checkpoint folder with one
    file mutated (bytes), or with ``trainer_state.json`` mutated structurally and its sha256
    fields recomputed (so the parser gets past the checksums). Documented: ``CheckpointError``.
``hfconfig``
    :func:`sinklab.load` on a Hugging Face folder whose ``config.json`` is mutated (wrong types,
    huge/negative sizes, NaN, missing keys, unknown architectures, RoPE scaling garbage, bytes)
    next to the ``model.safetensors`` of a tiny LLaMA, then a 4-token forward. Documented:
    ``ValueError`` and ``KeyError`` (a missing required key or tensor, named).
``core``
    :func:`sinklab.load` on a mutated GGUF of a whole tiny LLaMA (F32/F16/Q8_0/Q4_0/Q4_1/Q6_K),
    then a 4-token forward: the C core's size and offset checks see hostile shapes and blocks
    (run it with the ASan build: ``.ci/sanitize --fuzz N``). Documented: ``ValueError``.

Seeds are small synthetic files written here (a GGUF with byte-level BPE and SentencePiece
tokenizer metadata, F32/F16/Q8_0 tensors and a nested array; a safetensors file; a checkpoint of
a 1-layer model saved by :func:`save_checkpoint`). Mutations: bit flips, interesting bytes,
interesting integers (0, -1, 2^31, 2^62, 2^64-1, the file size, ...) written over every integer
field the seed's layout has (lengths, counts, types, dims, offsets), truncation, chunk deletion,
insertion and duplication (duplicated keys), and splices of two inputs. A hang is an input that
runs > ``--timeout`` seconds (SIGALRM). The address space is capped (``--mem-limit-gb`` above
the start) so that a reader trusting a length field of 2^62 fails with MemoryError (reported as
undocumented) rather than swapping. Every undocumented exception or hang is saved under
``--out`` (the input bytes, and a .txt with the traceback).

Prints a Markdown table (inputs, exceptions by type, undocumented, hangs, line coverage of the
parser's modules over the first ``--coverage`` inputs (function bodies, writers included), wall
time, inputs/s) with the command line, for benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sinklab.io.gguf_loader import GGUFError, open_gguf
from sinklab.io.gguf_reader import GGUFFormatError
from sinklab.io.hf_loader import SafetensorsError, read_safetensors, to_f32
from sinklab.train.checkpoint import CheckpointError

# The exception types each parser documents for bad input: anything else is a finding.
DOCUMENTED: Dict[str, Tuple[type, ...]] = {
    "gguf": (GGUFError, GGUFFormatError),
    "safetensors": (SafetensorsError,),
    "tokenizer": (ValueError,),
    "checkpoint": (CheckpointError,),
    # a missing required config key or tensor is a KeyError naming it (sinklab.families.base.hf_need)
    "hfconfig": (ValueError, KeyError),
    "core": (ValueError,),
}
PARSERS = tuple(DOCUMENTED)
TINY_IDS = (1, 5, 2, 7)  # the 4 token ids of the hfconfig and core targets' forward

_INTERESTING = (0, 1, 2, 3, 7, 8, 12, 13, 31, 32, 33, 255, 256, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                0xFFFFFFFF, 1 << 32, 1 << 40, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1)


class Hang(Exception):
    """Raised by SIGALRM inside an input that ran past the timeout."""


# ------------------------------------------------------------------ seeds
def _gstr(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_bytes(kv: Sequence[Tuple[str, int, Any]], tensors: Sequence[Tuple[str, Tuple[int, ...], int, bytes]],
               align: int = 32) -> Tuple[bytes, List[Tuple[int, int]]]:
    """A GGUF v3 file written by hand (independently of the reader under test), and the
    (offset, width) of every integer field in it (lengths, counts, types, dims, offsets).

    ``kv``: (key, GGUF value type, value); arrays as (element type, list). ``tensors``: (name,
    shape in NumPy order, ggml type, raw data)."""
    out = bytearray()
    fields: List[Tuple[int, int]] = []

    def put(fmt: str, v: Any) -> None:
        fields.append((len(out), struct.calcsize(fmt)))
        out.extend(struct.pack(fmt, v))

    def put_str(s: str) -> None:
        b = s.encode("utf-8")
        put("<Q", len(b))
        out.extend(b)

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}

    def put_value(vtype: int, v: Any) -> None:
        if vtype == 8:
            put_str(v)
        elif vtype == 9:
            etype, items = v
            put("<I", etype)
            put("<Q", len(items))
            for item in items:
                put_value(etype, item)
        else:
            put(scalar[vtype], v)

    out.extend(b"GGUF")
    put("<I", 3)
    put("<Q", len(tensors))
    put("<Q", len(kv))
    for key, vtype, v in kv:
        put_str(key)
        put("<I", vtype)
        put_value(vtype, v)
    offsets, pos = [], 0
    for _, _, _, raw in tensors:
        offsets.append(pos)
        pos = (pos + len(raw) + align - 1) // align * align
    for (name, shape, ttype, _), off in zip(tensors, offsets):
        put_str(name)
        put("<I", len(shape))
        for d in reversed(shape):
            put("<Q", d)
        put("<I", ttype)
        put("<Q", off)
    out.extend(b"\0" * (-len(out) % align))
    for (_, _, _, raw), off in zip(tensors, offsets):
        out.extend(raw)
        out.extend(b"\0" * (-len(out) % align))
    return bytes(out), fields


def _byte_vocab() -> List[str]:
    from tests.support.reference_models import bytes_to_unicode

    return list(bytes_to_unicode().values())


def gguf_seeds() -> List[Tuple[bytes, List[Tuple[int, int]]]]:
    """Two small GGUF files: byte-level BPE (``gpt2``/``smollm``) and SentencePiece (``llama``)
    tokenizer metadata, F32, F16 and Q8_0 tensors, an alignment field and a nested array."""
    rng = np.random.default_rng(0)
    byte_tokens = _byte_vocab()
    merged = ["Ġt", "he", "Ġthe", "Ġw", "or", "ld"]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ w", "o r", "l d"]
    tokens = byte_tokens + merged + ["<|im_start|>", "<|im_end|>", "<think>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]
    q8 = b"".join(struct.pack("<e", 0.01) + rng.integers(-127, 128, 32, dtype=np.int8).tobytes() for _ in range(2))
    tensors = [("token_embd.weight", (4, 8), 0, rng.standard_normal(32).astype("<f4").tobytes()),
               ("blk.0.attn_norm.weight", (2, 3), 1, rng.standard_normal(6).astype("<f2").tobytes()),
               ("output.weight", (64,), 8, q8)]
    common = [("general.architecture", 8, "llama"), ("general.alignment", 4, 32),
              ("llama.block_count", 4, 1), ("nested", 9, (9, [(4, [1, 2]), (4, [3])])),
              ("llama.context_length", 4, 16), ("llama.embedding_length", 4, 8), ("llama.feed_forward_length", 4, 16),
              ("llama.attention.head_count", 4, 2), ("llama.attention.head_count_kv", 4, 1),
              ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5), ("llama.rope.freq_base", 6, 10000.0),
              ("llama.vocab_size", 4, 4)]
    bpe = common + [("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.pre", 8, "smollm"),
                    ("tokenizer.ggml.tokens", 9, (8, tokens)), ("tokenizer.ggml.token_type", 9, (5, types)),
                    ("tokenizer.ggml.merges", 9, (8, merges)), ("tokenizer.ggml.bos_token_id", 4, len(tokens) - 3),
                    ("tokenizer.ggml.eos_token_id", 4, len(tokens) - 2), ("tokenizer.ggml.add_bos_token", 7, True)]
    sp_tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "t", "h", "e", "▁t", "he",
                                                                                      "▁the", "w", "o", "r", "l", "d"]
    sp_types = [2, 3, 3] + [6] * 256 + [1] * 12
    scores = [0.0] * 259 + [-float(i) for i in range(12)]
    spm = common + [("tokenizer.ggml.model", 8, "llama"), ("tokenizer.ggml.tokens", 9, (8, sp_tokens)),
                    ("tokenizer.ggml.token_type", 9, (5, sp_types)), ("tokenizer.ggml.scores", 9, (6, scores)),
                    ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.unknown_token_id", 4, 0),
                    ("tokenizer.ggml.add_space_prefix", 7, True)]
    return [gguf_bytes(bpe, tensors), gguf_bytes(spm, tensors[:1])]


def safetensors_seed() -> bytes:
    """A safetensors file written by ``safetensors.numpy.save`` (F32, F16, I64 tensors and
    metadata), with a hand-added BF16 entry's bytes left out: the package has no bfloat16."""
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    return save({"a.weight": rng.standard_normal((3, 4)).astype(np.float32),
                 "b.weight": rng.standard_normal((2, 2)).astype(np.float16),
                 "pos": np.arange(5, dtype=np.int64), "scalar": np.array(1.5, dtype=np.float32)},
                metadata={"format": "pt"})


def checkpoint_seed(folder: str) -> str:
    """A checkpoint of a 1-layer, d=16 LLaMA written by :func:`save_checkpoint` into ``folder``;
    returns the step folder."""
    from sinklab.train.checkpoint import save_checkpoint
    from sinklab.train.engine import Trainer, llama_config

    cfg = llama_config(vocab_size=32, d_model=16, n_layers=1, n_heads=2, context_length=16)
    return save_checkpoint(Trainer(cfg, seed=0), folder)


def _f16_blocks(rng: Any, n: int, nbytes: int, halves: int = 1) -> bytes:
    """``n`` blocks of a block-quant type of ``nbytes`` each: ``halves`` fp16 header values
    (scale 0.01, then minimum 0) and random quant bytes."""
    head = struct.pack("<" + "e" * halves, 0.01, *([0.0] * (halves - 1)))
    return b"".join(head + rng.integers(0, 256, nbytes - 2 * halves, dtype=np.uint8).tobytes() for _ in range(n))


def _q6k_blocks(rng: Any, n: int) -> bytes:
    """``n`` Q6_K super-blocks of 256 values (ql 128, qh 64, int8 scales 16, fp16 d: 210 bytes)
    with random quants and small scales."""
    return b"".join(rng.integers(0, 64, 208, dtype=np.uint8).tobytes() + struct.pack("<e", 0.001) for _ in range(n))


def tiny_model_gguf() -> Tuple[bytes, List[Tuple[int, int]]]:
    """A GGUF of a whole tiny LLaMA the loader accepts and the C core runs: 1 layer, d 32, 2
    heads (1 kv head, head_dim 16), F 256, vocabulary 32, no tokenizer; F32 embedding, norms
    and up, F16 LM head and gate, Q8_0 Q, Q4_0 K, Q4_1 V and output, Q6_K down (rows of F = 256).
    Returns the bytes and their integer fields (as :func:`gguf_bytes`)."""
    rng = np.random.default_rng(0)
    d, F, V, hd = 32, 256, 32, 16

    def f32(*shape: int) -> bytes:
        return (0.1 * rng.standard_normal(int(np.prod(shape)))).astype("<f4").tobytes()

    tensors = [("token_embd.weight", (V, d), 0, f32(V, d)),
               ("output_norm.weight", (d,), 0, np.ones(d, "<f4").tobytes()),
               ("output.weight", (V, d), 1, (0.1 * rng.standard_normal(V * d)).astype("<f2").tobytes()),
               ("blk.0.attn_norm.weight", (d,), 0, np.ones(d, "<f4").tobytes()),
               ("blk.0.attn_q.weight", (2 * hd, d), 8, _f16_blocks(rng, 2 * hd * d // 32, 34)),
               ("blk.0.attn_k.weight", (hd, d), 2, _f16_blocks(rng, hd * d // 32, 18)),
               ("blk.0.attn_v.weight", (hd, d), 3, _f16_blocks(rng, hd * d // 32, 20, 2)),
               ("blk.0.attn_output.weight", (d, 2 * hd), 3, _f16_blocks(rng, d * 2 * hd // 32, 20, 2)),
               ("blk.0.ffn_norm.weight", (d,), 0, np.ones(d, "<f4").tobytes()),
               ("blk.0.ffn_gate.weight", (F, d), 1, (0.1 * rng.standard_normal(F * d)).astype("<f2").tobytes()),
               ("blk.0.ffn_up.weight", (F, d), 0, f32(F, d)),
               ("blk.0.ffn_down.weight", (d, F), 14, _q6k_blocks(rng, d * F // 256))]
    kv = [("general.architecture", 8, "llama"), ("general.alignment", 4, 32),
          ("llama.block_count", 4, 1), ("llama.context_length", 4, 64), ("llama.embedding_length", 4, d),
          ("llama.feed_forward_length", 4, F), ("llama.attention.head_count", 4, 2),
          ("llama.attention.head_count_kv", 4, 1), ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
          ("llama.rope.freq_base", 6, 10000.0), ("llama.rope.dimension_count", 4, hd), ("llama.vocab_size", 4, V)]
    return gguf_bytes(kv, tensors)


def _tiny_hf_config(**changes: Any) -> Dict[str, Any]:
    c = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
         "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    c.update(changes)
    return {k: v for k, v in c.items() if v is not None}


def hf_config_seeds() -> List[bytes]:
    """config.json texts: the tiny LLaMA that matches :func:`tiny_hf_safetensors` (with and
    without RoPE scaling), and small configs of the other supported families."""
    configs = [_tiny_hf_config(),
               _tiny_hf_config(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
               _tiny_hf_config(rope_scaling={"type": "linear", "factor": 2.0}, tie_word_embeddings=True),
               _tiny_hf_config(rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rope_theta=None),
               _tiny_hf_config(model_type="mistral", sliding_window=4),
               _tiny_hf_config(model_type="qwen2", use_sliding_window=False, sliding_window=4, max_window_layers=1),
               _tiny_hf_config(model_type="gemma3_text", head_dim=4, query_pre_attn_scalar=4, sliding_window=4,
                               layer_types=["sliding_attention"], rope_local_base_freq=10000.0,
                               final_logit_softcapping=None, attn_logit_softcapping=None,
                               hidden_activation="gelu_pytorch_tanh", hidden_act=None),
               {"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, "n_positions": 32, "n_inner": 16,
                "vocab_size": 16, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"},
               {"model_type": "bert", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
                "intermediate_size": 16, "vocab_size": 16, "max_position_embeddings": 32, "type_vocab_size": 2,
                "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute"}]
    return [json.dumps(c, indent=1).encode() for c in configs]


def tiny_hf_safetensors() -> bytes:
    """model.safetensors of the tiny LLaMA of :func:`_tiny_hf_config` (HF tensor names, float32,
    with an untied lm_head)."""
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    d, F, V, hd = 8, 16, 16, 4
    t = {"model.embed_tokens.weight": (V, d), "model.norm.weight": (d,), "lm_head.weight": (V, d),
         "model.layers.0.input_layernorm.weight": (d,), "model.layers.0.post_attention_layernorm.weight": (d,),
         "model.layers.0.self_attn.q_proj.weight": (2 * hd, d), "model.layers.0.self_attn.k_proj.weight": (hd, d),
         "model.layers.0.self_attn.v_proj.weight": (hd, d), "model.layers.0.self_attn.o_proj.weight": (d, 2 * hd),
         "model.layers.0.mlp.gate_proj.weight": (F, d), "model.layers.0.mlp.up_proj.weight": (F, d),
         "model.layers.0.mlp.down_proj.weight": (d, F)}
    return save({k: (0.3 * rng.standard_normal(s)).astype(np.float32) for k, s in t.items()})


# ------------------------------------------------------------------ mutations
def _put_int(buf: bytearray, pos: int, width: int, v: int) -> None:
    buf[pos:pos + width] = (v % (1 << (8 * width))).to_bytes(width, "little")


def mutate_bytes(rng: random.Random, data: bytes, fields: Sequence[Tuple[int, int]] = (),
                 other: Optional[bytes] = None) -> bytes:
    """One to four stacked byte-level mutations of ``data`` (``fields``: integer fields to
    overwrite with interesting values; ``other``: an input to splice with)."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        n = len(buf)
        op = rng.randrange(10 if fields else 8)
        if n == 0:
            buf.extend(rng.randbytes(rng.randrange(1, 64)))
        elif op == 0:  # bit flips
            for _ in range(rng.randrange(1, 9)):
                i = rng.randrange(n)
                buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # interesting byte
            buf[rng.randrange(n)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:  # interesting integer anywhere
            w = rng.choice((1, 2, 4, 8))
            if n >= w:
                _put_int(buf, rng.randrange(n - w + 1), w, rng.choice(_INTERESTING + (n, n + 1, -1, -n)))
        elif op == 3:  # truncation
            del buf[rng.randrange(n):]
        elif op == 4:  # delete a chunk
            i = rng.randrange(n)
            del buf[i:i + rng.randrange(1, 65)]
        elif op == 5:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.randrange(1, 33))
        elif op == 6:  # duplicate a chunk (duplicated keys / entries)
            i = rng.randrange(n)
            chunk = buf[i:i + rng.randrange(1, 257)]
            j = rng.randrange(n + 1)
            buf[j:j] = chunk
        elif op == 7:  # splice with another input, or arithmetic on a byte
            if other:
                i, j = rng.randrange(n + 1), rng.randrange(len(other) + 1)
                buf = buf[:i] + bytearray(other[j:])
            else:
                i = rng.randrange(n)
                buf[i] = (buf[i] + rng.randrange(-16, 17)) % 256
        else:  # structure-aware: an interesting value, or +-small delta, in a known integer field
            pos, w = rng.choice(fields)
            if pos + w <= n:
                if op == 8:
                    _put_int(buf, pos, w, rng.choice(_INTERESTING + (n, n + 1, -1, n // 2)))
                else:
                    v = int.from_bytes(buf[pos:pos + w], "little")
                    _put_int(buf, pos, w, v + rng.choice((-2, -1, 1, 2, 8, 32)))
    return bytes(buf)


_WEIRD = (None, True, 0, -1, 1, 2 ** 31, 2 ** 63, 2 ** 64 + 5, -(2 ** 70), 1.5, float("nan"), float("inf"), 1e308,
          "", "x", "gpt2", "llama", "default", "bert", "\ud800", "a b", [], [1, 2], ["a"], {}, {"a": 1}, [[1]])


def weird_value(rng: random.Random, like: Any) -> Any:
    """A hostile replacement for a parsed value: a wrong type, an out-of-range number, a list of
    the wrong length or element type, or a slightly changed copy of ``like``."""
    r = rng.random()
    if r < 0.35:
        return rng.choice(_WEIRD)
    if isinstance(like, np.ndarray):
        choice = rng.randrange(5)
        if choice == 0:
            return like[: rng.randrange(len(like) + 1)]
        if choice == 1:
            return np.concatenate([like, like[: rng.randrange(1, 5)]]) if len(like) else like
        if choice == 2:
            return like.astype(rng.choice((np.float64, np.int64, np.uint8, np.float32, bool)))
        if choice == 3:
            out = like.copy()
            if out.size and out.dtype.kind in "iuf":
                v = rng.choice((-1, 0, 99, 2 ** 7, 127)) if out.dtype.kind != "f" else rng.choice((np.nan, np.inf, 1e38))
                try:
                    out.flat[rng.randrange(out.size)] = v
                except (ValueError, OverflowError):  # -1 into an unsigned array: keep the copy
                    pass
            return out
        return np.zeros((2, 2), like.dtype)
    if isinstance(like, list):
        out = list(like)
        choice = rng.randrange(6)
        if choice == 0 and out:
            del out[rng.randrange(len(out)):]
        elif choice == 1 and out:
            out[rng.randrange(len(out))] = rng.choice(("", " ", "a  b", "\x00", "Ġ Ġ", "<0xZZ>", "▁" * 40, 5, None))
        elif choice == 2:
            out += out[: rng.randrange(1, 20)]  # duplicated tokens / merges
        elif choice == 3:
            rng.shuffle(out)
        elif choice == 4:
            out = [rng.choice(("a", "b", "ab", "a b", "b a", "ab b", "")) for _ in range(rng.randrange(50))]
        else:
            out.append(rng.choice(_WEIRD))
        return out
    if isinstance(like, bool):
        return not like
    if isinstance(like, int):
        return like + rng.choice((-1, 1, 1000, -1000, 2 ** 40))
    if isinstance(like, str):
        return like[: rng.randrange(len(like) + 1)] + rng.choice(("", "x", "\x00", "é"))
    return rng.choice(_WEIRD)


def mutate_json_obj(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """A copy of a JSON-like object with one value somewhere replaced, deleted or duplicated."""
    if isinstance(obj, dict) and obj and depth < 6 and rng.random() < 0.7:
        obj = dict(obj)
        key = rng.choice(list(obj))
        r = rng.random()
        if r < 0.15:
            del obj[key]
        elif r < 0.25:
            obj[key + rng.choice(("", "_", "x"))] = obj[key]
        else:
            obj[key] = mutate_json_obj(rng, obj[key], depth + 1)
        return obj
    if isinstance(obj, list) and obj and depth < 6 and rng.random() < 0.6:
        obj = list(obj)
        i = rng.randrange(len(obj))
        if rng.random() < 0.2:
            del obj[i]
        else:
            obj[i] = mutate_json_obj(rng, obj[i], depth + 1)
        return obj
    v = weird_value(rng, obj)
    return v if not isinstance(v, np.ndarray) else v.tolist()


_ETYPE = {"u1": 0, "i1": 1, "u2": 2, "i2": 3, "u4": 4, "i4": 5, "f4": 6, "b1": 7, "u8": 10, "i8": 11, "f8": 12}


def _gguf_typed(v: Any) -> Tuple[Optional[int], Any]:
    """(GGUF value type, value) that :func:`gguf_bytes` writes for a Python value, so that mutated
    metadata is stored in a real file (None: a value a GGUF file cannot hold, dropped)."""
    if isinstance(v, (bool, np.bool_)):
        return 7, bool(v)
    if isinstance(v, (int, np.integer)):
        v = int(v)
        return (4, v) if 0 <= v < 1 << 32 else (11, v) if -(1 << 63) <= v < 1 << 63 else (10, v % (1 << 64))
    if isinstance(v, float):
        return 12, v
    if isinstance(v, str):
        return 8, v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.str[1:] in _ETYPE:
        return 9, (_ETYPE[v.dtype.str[1:]], v.tolist())
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return 9, (8, [x.encode("utf-8", "replace").decode("utf-8") for x in v])
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and 0 <= x < 1 << 31 for x in v):
            return 9, (5, [int(x) for x in v])
        if all(isinstance(x, list) and all(isinstance(y, int) and 0 <= y < 1 << 31 for y in x) for x in v):
            return 9, (9, [(5, x) for x in v])
    return None, None


# ------------------------------------------------------------------ targets
class Target:
    """One parser under fuzz: ``inputs(rng)`` draws an input, ``run(input)`` parses it."""

    name = ""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.path = os.path.join(workdir, f"input.{self.name}")

    def write(self, data: bytes) -> str:
        with open(self.path, "wb") as f:
            f.write(data)
        return self.path

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        raise NotImplementedError

    def run(self, kind: str, x: Any) -> None:
        raise NotImplementedError

    def save(self, kind: str, x: Any, dest: str) -> str:
        """Writes a reproducer of input ``x`` under ``dest``; returns its path."""
        h = hashlib.sha256(repr((kind, x)).encode() if not isinstance(x, bytes) else x).hexdigest()[:12]
        path = os.path.join(dest, f"{self.name}-{kind}-{h}" + (".bin" if isinstance(x, bytes) else ".repr"))
        with open(path, "wb") as f:
            f.write(x if isinstance(x, bytes) else repr(x).encode())
        return path


class GGUFTarget(Target):
    name = "gguf"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.seeds = gguf_seeds()

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        data, fields = rng.choice(self.seeds)
        other = rng.choice(self.seeds)[0] if rng.random() < 0.1 else None
        return "bytes", mutate_bytes(rng, data, fields, other)

    def run(self, kind: str, x: Any) -> None:
        from sinklab.io.gguf_loader import read_config

        f = open_gguf(self.write(x))
        for t in f.tensors:  # the views must lie inside the map
            int(np.asarray(t.data).sum(dtype=np.uint64))
        if "general.architecture" in f.fields:  # what sinklab.load reads next
            read_config(f)


class SafetensorsTarget(Target):
    name = "safetensors"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.seed = safetensors_seed()
        (n,) = struct.unpack("<Q", self.seed[:8])
        self.header = json.loads(self.seed[8:8 + n])
        self.body = self.seed[8 + n:]
        self.fields = [(0, 8)]

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        r = rng.random()
        if r < 0.5:
            return "bytes", mutate_bytes(rng, self.seed, self.fields)
        if r < 0.55:  # deep nesting / huge numbers the JSON decoder must survive
            text = rng.choice(("[" * 100000 + "]" * 100000, '{"a":' * 50000 + "1" + "}" * 50000,
                               '{"a": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}}',
                               '{"a": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}'))
        else:
            header = mutate_json_obj(rng, self.header)
            try:
                text = json.dumps(header)
            except (ValueError, TypeError):
                text = "{}"
            if rng.random() < 0.1:  # a duplicated key, which json.dumps cannot write
                text = text[:-1] + ', "a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
        raw = text.encode("utf-8", "surrogatepass")
        data = struct.pack("<Q", len(raw)) + raw + self.body
        if rng.random() < 0.2:
            data = mutate_bytes(rng, data, self.fields)
        return "bytes", data

    def run(self, kind: str, x: Any) -> None:
        table = read_safetensors(self.write(x))
        for dtype, shape, raw in table.values():
            if dtype in ("F32", "F16", "BF16"):
                a = to_f32(dtype, shape, raw)
                assert a.shape == shape and a.dtype == np.float32


class TokenizerTarget(GGUFTarget):
    name = "tokenizer"
    TEXT = "Hello world, the <|im_start|>user 12345 <think> x\n\t  é"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        from sinklab.io.gguf_reader import GGUFFile
        from sinklab.tokenizer.gguf_meta import read_metadata

        self.metas = []
        for data, _ in self.seeds:
            self.metas.append(read_metadata(GGUFFile(self.write(data))))

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        if rng.random() < 0.5:
            return super().draw(rng)
        meta = dict(rng.choice(self.metas))
        kv = [(k, *_gguf_typed(v)) for k, v in self._mutated(rng, meta).items()]
        return "bytes", gguf_bytes([x for x in kv if x[1] is not None], [])[0]

    def _mutated(self, rng: random.Random, meta: Dict[str, Any]) -> Dict[str, Any]:
        for _ in range(rng.choice((1, 1, 2, 3))):
            key = rng.choice(list(meta) + ["tokenizer.ggml.pre", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                                           "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_bos_token"])
            if rng.random() < 0.1:
                meta.pop(key, None)
            else:
                meta[key] = weird_value(rng, meta.get(key))
        return meta

    def run(self, kind: str, x: Any) -> None:
        from sinklab.tokenizer import Tokenizer

        tok = Tokenizer.from_gguf(self.write(x))
        ids = tok.encode(self.TEXT, bos=tok.bos_token_id is not None)
        tok.decode(ids)


class CheckpointTarget(Target):
    name = "checkpoint"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        seed_dir = checkpoint_seed(os.path.join(workdir, "seed-run"))
        self.files = {n: open(os.path.join(seed_dir, n), "rb").read() for n in sorted(os.listdir(seed_dir))}
        self.state = json.loads(self.files["trainer_state.json"])
        self.folder = os.path.join(workdir, "ckpt", "step-000000")

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        from sinklab.train.checkpoint import STATE_FILE, _json_bytes, _state_digest

        files = dict(self.files)
        state = json.loads(json.dumps(self.state))
        r = rng.random()
        if r < 0.4:  # structured: the state's fields, with checksums that match
            state = mutate_json_obj(rng, state)
            if not isinstance(state, dict):
                files[STATE_FILE] = json.dumps(state).encode()
                return "verify", files
        else:  # bytes of one file, its recorded size and sha256 updated half of the time
            name = rng.choice(sorted(files))
            files[name] = mutate_bytes(rng, files[name], [(0, 8)] if name.endswith(".safetensors") else ())
            if name == STATE_FILE or rng.random() < 0.5:
                return rng.choice(("verify", "noverify")), files
            state["files"][name] = {"bytes": len(files[name]), "sha256": hashlib.sha256(files[name]).hexdigest()}
        if rng.random() < 0.9:
            try:
                state["state_sha256"] = _state_digest(state)
            except (TypeError, ValueError):
                pass
        try:
            files[STATE_FILE] = _json_bytes(state)
        except (TypeError, ValueError):
            files[STATE_FILE] = b"{}"
        return rng.choice(("verify", "noverify")), files

    def run(self, kind: str, x: Any) -> None:
        from sinklab.train.checkpoint import load_checkpoint

        if os.path.isdir(self.folder):
            shutil.rmtree(self.folder)
        os.makedirs(self.folder)
        for name, data in x.items():
            with open(os.path.join(self.folder, name), "wb") as f:
                f.write(data)
        ck = load_checkpoint(self.folder, verify=kind == "verify")
        with np.errstate(all="ignore"):  # mutated floats may be NaN/inf: only reading them matters
            for a in list(ck.tensors.values()) + [ck.mom, ck.vel]:
                float(np.asarray(a, dtype=np.float64).sum())

    def save(self, kind: str, x: Any, dest: str) -> str:
        h = hashlib.sha256(b"".join(x[k] for k in sorted(x))).hexdigest()[:12]
        path = os.path.join(dest, f"checkpoint-{h}")
        os.makedirs(path, exist_ok=True)
        for name, data in x.items():
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)
        return path


def forward4(model: Any) -> None:
    """A 4-token forward of ``model`` in the C core (ids below its vocabulary), touching the
    attention probabilities."""
    ids = np.array([i % model.config.vocab_size for i in TINY_IDS], np.int64)
    tr = model.run(ids, capture="attn", progress=False)
    with np.errstate(all="ignore"):
        float(np.asarray(tr.attn, np.float64).sum())


_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
                "rms_norm_eps", "sliding_window", "layer_types", "model_type", "tie_word_embeddings", "eos_token_id",
                "hidden_act", "final_logit_softcapping", "attn_logit_softcapping", "query_pre_attn_scalar", "n_layer")


def mutate_config(rng: random.Random, c: Any) -> bytes:
    """config.json text of ``c`` (a parsed config) with one to three hostile edits: a key the
    families read set to a wrong type, a huge or negative size, NaN, or RoPE scaling garbage;
    or a value anywhere replaced, deleted or duplicated (:func:`mutate_json_obj`)."""
    for _ in range(rng.choice((1, 1, 2, 3))):
        if isinstance(c, dict) and rng.random() < 0.3:
            key = rng.choice(_CONFIG_KEYS)
            c[key] = rng.choice((weird_value(rng, c.get(key)), {"rope_type": rng.choice(("llama3", "linear", "x")),
                                 "factor": rng.choice((0, -1.0, float("nan"), "8", 1e308))}, 1 << 62, -(1 << 40)))
        else:
            c = mutate_json_obj(rng, c)
    try:
        return json.dumps(c).encode()
    except (TypeError, ValueError):
        return b"{}"


class HFConfigTarget(Target):
    """A Hugging Face folder whose config.json is the input, next to the tiny LLaMA's
    model.safetensors: :func:`sinklab.load`, then a 4-token forward."""

    name = "hfconfig"
    _SPECIAL = (b"[" * 100000 + b"]" * 100000, b'{"a":' * 50000 + b"1" + b"}" * 50000, b"\xff\xfe{}", b"",
                b"null", b"[]", b'"llama"', b'{"model_type": "llama", "hidden_size": ' + b"9" * 5000 + b"}")

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.folder = os.path.join(workdir, "hf")
        os.makedirs(self.folder, exist_ok=True)
        with open(os.path.join(self.folder, "model.safetensors"), "wb") as f:
            f.write(tiny_hf_safetensors())
        self.path = os.path.join(self.folder, "config.json")
        self.texts = hf_config_seeds()
        self.configs = [json.loads(t) for t in self.texts]

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        r = rng.random()
        if r < 0.02:
            return "bytes", rng.choice(self._SPECIAL)
        if r < 0.3:
            return "bytes", mutate_bytes(rng, rng.choice(self.texts))
        return "bytes", mutate_config(rng, json.loads(json.dumps(rng.choice(self.configs))))

    def run(self, kind: str, x: Any) -> None:
        import sinklab as sl

        self.write(x)
        forward4(sl.load(self.folder))


class CoreTarget(Target):
    """A GGUF of a whole tiny LLaMA: :func:`sinklab.load`, then a 4-token forward in the C core."""

    name = "core"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.seed, self.fields = tiny_model_gguf()

    def draw(self, rng: random.Random) -> Tuple[str, Any]:
        return "bytes", mutate_bytes(rng, self.seed, self.fields)

    def run(self, kind: str, x: Any) -> None:
        import sinklab as sl

        forward4(sl.load(self.write(x)))


TARGETS: Dict[str, Callable[[str], Target]] = {"gguf": GGUFTarget, "safetensors": SafetensorsTarget,
                                               "tokenizer": TokenizerTarget, "checkpoint": CheckpointTarget,
                                               "hfconfig": HFConfigTarget, "core": CoreTarget}


# ------------------------------------------------------------------ line coverage
# The modules each parser's code lives in (coverage is reported over whole modules, writers included).
MODULES: Dict[str, Tuple[str, ...]] = {
    "gguf": ("sinklab.io.gguf_reader", "sinklab.io.gguf_loader"),
    "safetensors": ("sinklab.io.hf_loader",),
    "tokenizer": ("sinklab.tokenizer.gguf_meta", "sinklab.tokenizer.bpe", "sinklab.tokenizer.spm",
                  "sinklab.tokenizer.core"),
    "checkpoint": ("sinklab.train.checkpoint",),
    "hfconfig": ("sinklab.io.hf_loader", "sinklab.families.config", "sinklab.families.base", "sinklab.families.llama",
                 "sinklab.families.qwen2", "sinklab.families.gemma", "sinklab.families.gpt2", "sinklab.families.bert",
                 "sinklab.families.rope"),
    "core": ("sinklab.io.gguf_reader", "sinklab.io.gguf_loader", "sinklab.families.llama", "sinklab.families.tensors"),
}


def _code_lines(code: Any) -> set:
    lines = {ln for _, _, ln in code.co_lines() if ln is not None}
    for c in code.co_consts:
        if hasattr(c, "co_lines"):
            lines |= _code_lines(c)
    return lines


class LineCoverage:
    """Lines executed in a set of modules, by a ``sys.settrace`` tracer limited to their files
    (slow: used on the first ``--coverage`` inputs only)."""

    def __init__(self, modules: Sequence[str]) -> None:
        import importlib

        self.files: Dict[str, set] = {}
        for m in modules:
            path = os.path.realpath(importlib.import_module(m).__file__)
            with open(path) as f:
                code = compile(f.read(), path, "exec")
            # Lines of module-level code run at import, not per input: counted over function bodies.
            self.files[path] = set().union(*[_code_lines(c) for c in code.co_consts if hasattr(c, "co_lines")])
        self.hit: Dict[str, set] = {p: set() for p in self.files}

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        hits = self.hit.get(os.path.realpath(frame.f_code.co_filename))
        if hits is None:
            return None
        hits.add(frame.f_lineno)

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line":
                hits.add(frame.f_lineno)
            return local
        return local

    def __enter__(self) -> "LineCoverage":
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(None)

    def summary(self) -> Tuple[int, int]:
        """(lines executed, executable lines in function bodies) over all the modules."""
        hit = sum(len(self.hit[p] & self.files[p]) for p in self.files)
        return hit, sum(len(v) for v in self.files.values())


# ------------------------------------------------------------------ the loop
def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def fuzz(parser: str, n: int, seed: int = 0, timeout: float = 5.0, out: Optional[str] = None,
         progress: bool = False, max_seconds: Optional[float] = None, coverage: int = 0) -> Dict[str, Any]:
    """Runs ``n`` mutated inputs through ``parser`` (one of :data:`PARSERS`); the first
    ``coverage`` of them under a line tracer (the result's "coverage": (lines hit, lines) of
    :data:`MODULES`, or None).

    Returns:
        {"parser", "inputs", "accepted" (parsed without error), "exceptions" ({type name: count}),
        "undocumented" ([(type name, message, reproducer path)]), "hangs" ([reproducer path]),
        "seconds" (wall), "slowest" (seconds of the slowest input)}.
    """
    rng = random.Random(f"{parser}:{seed}")
    documented = DOCUMENTED[parser]
    work = tempfile.mkdtemp(prefix=f"sinklab-fuzz-{parser}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    dest = out or os.path.join(work, "findings")
    os.makedirs(dest, exist_ok=True)
    res: Dict[str, Any] = {"parser": parser, "inputs": 0, "accepted": 0, "exceptions": collections.Counter(),
                           "undocumented": [], "hangs": [], "seconds": 0.0, "slowest": 0.0, "findings_dir": dest,
                           "coverage": None}
    cov = LineCoverage(MODULES[parser]) if coverage > 0 else None
    old = signal.signal(signal.SIGALRM, _alarm)
    bar = None
    if progress:
        from sinklab.progress import progress_bar

        bar = progress_bar(total=n, desc=f"fuzz {parser}", unit="input", mininterval=2.0)
    t0 = time.perf_counter()
    try:
        target = TARGETS[parser](work)
        for i in range(n):
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                break
            kind, x = target.draw(rng)
            t1 = time.perf_counter()
            hung = False
            tracing = cov is not None and i < coverage
            signal.setitimer(signal.ITIMER_REAL, timeout * (20 if tracing else 1))
            try:
                if tracing:
                    with cov:
                        target.run(kind, x)
                else:
                    target.run(kind, x)
                res["accepted"] += 1
            except Hang:
                hung = True
                res["hangs"].append(target.save(kind, x, dest))
            except documented as e:
                res["exceptions"][type(e).__name__] += 1
            except BaseException as e:  # noqa: B036 - everything else is a finding (KeyboardInterrupt aside)
                if isinstance(e, KeyboardInterrupt):
                    raise
                res["exceptions"][type(e).__name__] += 1
                path = target.save(kind, x, dest)
                with open(path + ".txt", "w") as f:
                    f.write(traceback.format_exc())
                res["undocumented"].append((type(e).__name__, str(e)[:200], path))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            dt = time.perf_counter() - t1
            if not tracing:
                res["slowest"] = max(res["slowest"], dt)
            if dt > timeout and not hung and not tracing:
                res["hangs"].append(target.save(kind, x, dest))  # a hang no signal could interrupt (native code)
            res["inputs"] += 1
            if bar is not None:
                bar.update(1)
    finally:
        signal.signal(signal.SIGALRM, old)
        if bar is not None:
            bar.close()
        res["seconds"] = time.perf_counter() - t0
        if cov is not None:
            res["coverage"] = cov.summary()
        for name in os.listdir(work):
            if name != "findings":
                p = os.path.join(work, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
        if out is None and not os.listdir(dest):
            shutil.rmtree(work)
    return res


def _cov(c: Optional[Tuple[int, int]]) -> str:
    return "-" if c is None else f"{c[0]}/{c[1]} lines ({100 * c[0] / max(c[1], 1):.0f}%)"


def exceptions_cell(counts: Dict[str, int]) -> str:
    """``{type: count}`` as a table cell, the most frequent first."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "-"


def markdown(results: Sequence[Dict[str, Any]], argv: Sequence[str]) -> str:
    """The Markdown table for benchmarks/RESULTS.md."""
    lines = [f"`python benchmarks/fuzz_parsers.py {' '.join(argv)}`", "",
             "| parser | inputs | parsed OK | exceptions by type | undocumented | hangs (> 5 s) | slowest input | "
             "line coverage | wall | inputs/s |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['parser']} | {r['inputs']:,} | {r['accepted']:,} | {exceptions_cell(r['exceptions'])} | {len(r['undocumented'])} | "
                     f"{len(r['hangs'])} | {r['slowest'] * 1e3:.1f} ms | {_cov(r['coverage'])} | {r['seconds']:.1f} s | "
                     f"{r['inputs'] / max(r['seconds'], 1e-9):,.0f} |")
    return "\n".join(lines)


def _cap_memory(gb: float) -> None:
    """Caps the address space at what the process maps now plus ``gb`` GiB."""
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm + int(gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parser", choices=PARSERS + ("all",), default="all")
    p.add_argument("--n", type=int, default=100_000, help="inputs per parser")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds after which an input is a hang")
    p.add_argument("--out", default=None, help="folder for reproducers (default: a temp folder, kept if any)")
    p.add_argument("--mem-limit-gb", type=float, default=4.0, help="address space allowed above the start (0: none)")
    p.add_argument("--max-seconds", type=float, default=None, help="stop each parser after this long")
    p.add_argument("--coverage", type=int, default=300, metavar="K",
                   help="trace line coverage of the parser's modules over the first K inputs (0: off)")
    args = p.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    import sinklab.tokenizer  # noqa: F401 - imported before the cap: tokenizers maps its arenas early
    import tokenizers  # noqa: F401

    if args.mem_limit_gb > 0:
        _cap_memory(args.mem_limit_gb)
    results = []
    for parser in (PARSERS if args.parser == "all" else (args.parser,)):
        r = fuzz(parser, args.n, args.seed, args.timeout, args.out, progress=True, max_seconds=args.max_seconds,
                 coverage=args.coverage)
        results.append(r)
        print(markdown([r], argv).splitlines()[-1], file=sys.stderr, flush=True)  # kept if a later parser fails
        for name, msg, path in r["undocumented"][:20]:
            print(f"UNDOCUMENTED {parser}: {name}: {msg}\n  reproducer: {path}", file=sys.stderr)
        for path in r["hangs"][:20]:
            print(f"HANG {parser}: reproducer: {path}", file=sys.stderr)
        if r["undocumented"] or r["hangs"]:
            print(f"findings of {parser} in {r['findings_dir']}", file=sys.stderr)
    print(markdown(results, argv))
    return 1 if any(r["undocumented"] or r["hangs"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
