"""Tokenizers for the models sinklab runs, built on Hugging Face ``tokenizers`` from local files.

Two sources, no network and no pickle:

* a GGUF file: the vocabulary, merges, scores, token types and special ids stored as
  ``tokenizer.ggml.*`` metadata, interpreted the way llama.cpp (``src/llama-vocab.cpp``) does;
* a Hugging Face folder: ``tokenizer.json`` plus, when present, ``tokenizer_config.json``,
  ``special_tokens_map.json`` and ``config.json`` for the BOS/EOS ids and the BOS default.

::

    tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("<|im_start|>user\\nhi<|im_end|>")   # np.ndarray, int64, shape (T,)
    tok.decode(ids)                                       # the same text back

Supported GGUF tokenizers (``tokenizer.ggml.model``):

``"gpt2"``
    Byte-level BPE with the file's merges. The text is split before BPE by the regexes llama.cpp
    uses for ``tokenizer.ggml.pre`` (see ``_BPE_PRE``); an unknown ``pre`` raises ``ValueError``
    (llama.cpp would fall back to ``"default"`` with a warning). A file without the key is read as
    ``"default"``, as llama.cpp does.
``"llama"``
    SentencePiece-style BPE: spaces become ``▁``, a ``▁`` is prepended to the text when
    ``tokenizer.ggml.add_space_prefix`` is true (the default), pairs merge best-score first
    (merges are rebuilt from ``tokenizer.ggml.scores`` when the file has none), and characters
    outside the vocabulary fall back to ``<0xNN>`` byte tokens.

In both, tokens of type 3 (control, e.g. ``<|im_start|>``) are registered as special added tokens
and tokens of type 4 (user-defined, e.g. ``<think>``) as non-special added tokens, so either is
always matched whole in the input text: this is llama.cpp with ``parse_special=True`` and
transformers' GGUF conversion.

SentencePiece vocabularies follow llama.cpp (and ``sentencepiece`` itself) rather than
``transformers``' GGUF conversion where the two differ: text starting with a space gets its own
extra ``▁`` (``" the"`` -> ``▁▁the``), and text right after a special token gets a ``▁`` prefix
too (``"<s>the"`` -> ``<s> ▁the``). ``transformers`` (a ``Metaspace`` pre-tokenizer with
``prepend_scheme="first"``) does neither; everywhere else the ids are the same.

Other deliberate choices: tokens of type 2 (``<unk>``) are not matched in the text (llama.cpp
matches them, transformers does not); ``decode`` writes special tokens out and never applies
llama.cpp's ``clean_spaces`` clean-up, so ``decode(encode(s)) == s`` for any text with
byte-level BPE, and for SentencePiece text without special tokens (after one, the ``▁`` prefix
decodes to a space).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Tokenizer"]

# ---------------------------------------------------------------------------------------------
# Pre-tokenizer regexes for byte-level BPE, keyed by `tokenizer.ggml.pre`.
# Taken from llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp); each entry is applied in turn,
# every regex splitting the pieces the previous one left ("isolated": matched and unmatched
# stretches both become pieces), exactly like llama.cpp's unicode_regex_split.
# ---------------------------------------------------------------------------------------------

# GPT-2. llama.cpp writes it without the final `|\s+`; with it this is the regex of the
# `tokenizers` ByteLevel pre-tokenizer. The two split identically under "isolated" splitting:
# the only text `\s+` can match here is a lone non-space whitespace character before a
# non-space, which is left as a piece of its own either way.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Tekken and GPT-4o: the original tokenizer.json regexes (llama.cpp runs an emulation of them).
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (regexes applied in order, ignore_merges, add_bos default) per llama.cpp pre-tokenizer type
_PRE_DEFAULT = ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False)
_PRE_GPT2 = ((_GPT2,), False, False)
_PRE_SMOLLM = ((r"\p{N}", _GPT2), False, False)  # digits one by one, then GPT-2
_PRE_FALCON = ((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"), False, False)
_PRE_LLAMA3 = ((_LLAMA3,), True, True)
_PRE_DBRX = ((_LLAMA3,), False, False)
_PRE_QWEN2 = ((_QWEN2,), False, False)
_PRE_TEKKEN = ((_TEKKEN,), True, True)
_PRE_GPT4O = ((_GPT4O,), False, False)

_BPE_PRE: Dict[str, Tuple[Tuple[str, ...], bool, bool]] = {
    "default": _PRE_DEFAULT,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), _PRE_LLAMA3
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _PRE_DBRX),
    "falcon": _PRE_FALCON,
    **dict.fromkeys(
        (
            "gpt-2", "phi-2", "mpt", "olmo", "jais", "gigachat", "exaone4", "trillion",
            "granite-docling", "mellum", "a.x-4.0",
        ),
        _PRE_GPT2,
    ),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), _PRE_SMOLLM
    ),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan"), _PRE_QWEN2
    ),
    "tekken": _PRE_TEKKEN,
    **dict.fromkeys(("gpt-4o", "llama4"), _PRE_GPT4O),
}

_SUPPORTED_MODELS = ("gpt2", "llama")

# llama.cpp token types (tokenizer.ggml.token_type)
_TT_CONTROL = 3
_TT_USER_DEFINED = 4


# ---------------------------------------------------------------------------------------------
# GGUF metadata
# ---------------------------------------------------------------------------------------------

# GGUF value types: struct code and numpy dtype of the fixed-size ones
_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_NP = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8", 11: "i8", 12: "f8"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _wanted_key(key: str) -> bool:
    return key == "general.architecture" or key.startswith("tokenizer.")


def _read_gguf_metadata(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The ``general.architecture`` and ``tokenizer.*`` metadata of a GGUF file.

    Reads only the key/value section (no tensor info, no tensor data), which for a 49k-token
    vocabulary takes tens of milliseconds where ``gguf.GGUFReader`` takes seconds. Handles
    GGUF v2 and v3, little- or big-endian. Values: ``str``, ``int``, ``float``, ``bool``,
    ``list[str]`` for string arrays and 1-D ``np.ndarray`` for numeric arrays.
    """
    path = os.fspath(path)
    if os.path.getsize(path) < 24:
        raise ValueError(f"{path} is not a GGUF file (too short)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        size = len(mm)
        if size < 24 or mm[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
        (version,) = struct.unpack_from("<I", mm, 4)
        e = "<"
        if version & 0xFFFF == 0:  # written on a big-endian host
            e = ">"
            (version,) = struct.unpack_from(">I", mm, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
        _n_tensors, n_kv = struct.unpack_from(e + "QQ", mm, 8)
        u64 = struct.Struct(e + "Q").unpack_from
        u32 = struct.Struct(e + "I").unpack_from
        pos = 24

        def need(n: int) -> None:
            if n < 0 or pos + n > size:
                raise ValueError(f"{path}: truncated or corrupt GGUF metadata at byte {pos}")

        def read_str(decode: bool) -> Optional[str]:
            nonlocal pos
            need(8)
            (n,) = u64(mm, pos)
            pos += 8
            need(n)
            s = mm[pos:pos + n].decode("utf-8", "replace") if decode else None
            pos += n
            return s

        out: Dict[str, Any] = {}
        for _ in range(n_kv):
            key = read_str(True)
            need(4)
            (vtype,) = u32(mm, pos)
            pos += 4
            keep = _wanted_key(key)
            if vtype in _GGUF_SCALAR:
                width = struct.calcsize(_GGUF_SCALAR[vtype])
                need(width)
                if keep:
                    (out[key],) = struct.unpack_from(e + _GGUF_SCALAR[vtype], mm, pos)
                pos += width
            elif vtype == _GGUF_STRING:
                s = read_str(keep)
                if keep:
                    out[key] = s
            elif vtype == _GGUF_ARRAY:
                need(12)
                (etype,) = u32(mm, pos)
                (count,) = u64(mm, pos + 4)
                pos += 12
                if etype in _GGUF_NP:
                    dt = np.dtype(_GGUF_NP[etype]).newbyteorder(e)
                    nbytes = count * dt.itemsize
                    need(nbytes)
                    if keep:
                        arr = np.frombuffer(mm[pos:pos + nbytes], dtype=dt).astype(dt.newbyteorder("="))
                        out[key] = arr.astype(bool) if etype == 7 else arr
                    pos += nbytes
                elif etype == _GGUF_STRING:
                    need(8 * count)  # every string has at least its 8-byte length
                    if keep:
                        items: List[str] = []
                        append = items.append
                        for _ in range(count):
                            need(8)
                            (n,) = u64(mm, pos)
                            pos += 8
                            need(n)
                            append(mm[pos:pos + n].decode("utf-8", "replace"))
                            pos += n
                        out[key] = items
                    else:
                        for _ in range(count):
                            need(8)
                            (n,) = u64(mm, pos)
                            pos += 8 + n
                        need(0)
                else:
                    raise ValueError(f"{path}: GGUF key {key!r} holds an array of unsupported type {etype}")
            else:
                raise ValueError(f"{path}: GGUF key {key!r} has unknown value type {vtype}")
    return out


def _field_value(field: Any) -> Any:
    """The value of one ``gguf.ReaderField``, in the same form as ``_read_gguf_metadata``."""
    from gguf import GGUFValueType

    types = list(field.types)
    if not types:
        return None
    main = types[0]
    if main == GGUFValueType.ARRAY:
        sub = types[-1]
        if sub == GGUFValueType.STRING:
            parts = field.parts
            return [bytes(parts[i]).decode("utf-8", "replace") for i in field.data]
        if not field.data:
            return np.zeros(0, dtype=_GGUF_NP.get(int(sub), "f4"))
        parts = field.parts
        arr = np.concatenate([np.asarray(parts[i]).reshape(-1) for i in field.data])
        arr = arr.astype(arr.dtype.newbyteorder("="))
        return arr.astype(bool) if sub == GGUFValueType.BOOL else arr
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    value = field.parts[-1].tolist()[0]
    return bool(value) if main == GGUFValueType.BOOL else value


def _reader_metadata(reader: Any) -> Dict[str, Any]:
    """``general.architecture`` and ``tokenizer.*`` metadata of an open ``gguf.GGUFReader``."""
    return {key: _field_value(field) for key, field in reader.fields.items() if _wanted_key(key)}


# ---------------------------------------------------------------------------------------------
# Building the `tokenizers` backend from GGUF metadata
# ---------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _split_merges(merges: Iterable[str]) -> List[Tuple[str, str]]:
    """``"a b"`` -> ``("a", "b")``, splitting at the first space after position 0 as llama.cpp does."""
    out = []
    for m in merges:
        i = m.find(" ", 1)
        if i > 0:
            out.append((m[:i], m[i + 1:]))
    return out


def _valid_merges(merges: List[Tuple[str, str]], vocab: Dict[str, int]) -> List[Tuple[str, str]]:
    """Drop merges whose parts or result are not tokens (``tokenizers`` refuses them; llama.cpp
    can never produce a token from them)."""
    return [(a, b) for a, b in merges if a in vocab and b in vocab and (a + b) in vocab]


def _merges_from_scores(tokens: Sequence[str], scores: np.ndarray, vocab: Dict[str, int]) -> List[Tuple[str, str]]:
    """BPE merges equivalent to SentencePiece/llama.cpp's score-driven pair merging.

    llama.cpp merges, at each step, the adjacent pair whose concatenation is the vocabulary token
    with the highest score. As BPE merges: every split ``(l, r)`` of every token with both halves
    in the vocabulary, ranked by the token's score, best first. Ties are broken as
    ``transformers.tokenization_utils_base.generate_merges`` does (longer left part first, then
    longer right part, then token id / part ids), so that both give identical merge tables.
    """
    entries = []
    for tok_id, tok in enumerate(tokens):
        if vocab.get(tok) != tok_id:  # a duplicate string: only its last id is reachable
            continue
        score = float(scores[tok_id])
        local = []
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        for _, _, left, right in local:
            entries.append((score, len(left), len(right), left, right))
    # Python's sort is stable, also with reverse=True: equal keys keep token order.
    entries.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
    return [(left, right) for _, _, _, left, right in entries]


def _token_list(meta: Dict[str, Any]) -> List[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF has no tokenizer.ggml.tokens: it carries no tokenizer")
    # llama.cpp renames empty tokens the same way; an empty string cannot be a BPE token.
    return [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def _token_types(meta: Dict[str, Any], n: int) -> np.ndarray:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return np.ones(n, dtype=np.int32)
    types = np.asarray(types)
    if types.shape != (n,):
        raise ValueError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
    return types


def _build_gpt2(meta: Dict[str, Any], tokens: List[str], types: np.ndarray):
    from tokenizers import Regex
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, models, pre_tokenizers

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _BPE_PRE:
        raise ValueError(
            f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} for tokenizer model 'gpt2'; "
            f"supported: {sorted(_BPE_PRE)}"
        )
    splits, ignore_merges, add_bos = _BPE_PRE[pre]

    # Normal tokens are spelled in the byte-level alphabet already; one that is not (rare) is
    # respelled through it, as transformers does. Control / user-defined tokens keep their raw
    # text: they are matched whole as added tokens and never produced by BPE.
    to_unicode = _bytes_to_unicode()
    alphabet = set(to_unicode.values())
    vocab: Dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if types[i] not in (_TT_CONTROL, _TT_USER_DEFINED) and not alphabet.issuperset(tok):
            spelled = "".join(to_unicode[b] for b in tok.encode("utf-8"))
            if spelled not in vocab:
                tok = spelled
        vocab[tok] = i
    merges_raw = meta.get("tokenizer.ggml.merges")
    if merges_raw is None:
        raise ValueError("GGUF tokenizer model 'gpt2' has no tokenizer.ggml.merges")
    merges = _valid_merges(_split_merges(merges_raw), vocab)

    backend = _Backend(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    if splits == (_GPT2,):
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    return backend, add_bos


def _build_llama(meta: Dict[str, Any], tokens: List[str], types: np.ndarray):
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, models, normalizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if meta.get("tokenizer.ggml.merges"):
        merges = _valid_merges(_split_merges(meta["tokenizer.ggml.merges"]), vocab)
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise ValueError("GGUF tokenizer model 'llama' has neither tokenizer.ggml.scores nor merges")
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape != (len(tokens),):
            raise ValueError(f"tokenizer.ggml.scores has {scores.size} entries for {len(tokens)} tokens")
        merges = _merges_from_scores(tokens, scores, vocab)

    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = _Backend(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    # llama.cpp: every stretch of raw text (the start, and whatever follows a special or
    # user-defined token) gets " " prepended when add_space_prefix is set, then every space
    # becomes "▁". As normalizers, these run on exactly those stretches, since added tokens are
    # cut out of the text first. (A Metaspace pre-tokenizer would not prepend to text that
    # already starts with a space, nor after a special token.)
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps_n = [normalizers.Prepend("▁")] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence(steps_n + [normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend, True  # llama.cpp adds BOS to SentencePiece vocabularies unless told not to


def _register_added_tokens(backend, tokens: List[str], types: np.ndarray) -> None:
    from tokenizers import AddedToken

    control = [AddedToken(tokens[i], special=True, normalized=False) for i in np.nonzero(types == _TT_CONTROL)[0]]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.nonzero(types == _TT_USER_DEFINED)[0]]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def _opt_id(meta: Dict[str, Any], key: str, n: int) -> Optional[int]:
    v = meta.get(key)
    if v is None:
        return None
    v = int(v)
    return v if 0 <= v < n else None


# ---------------------------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------------------------


def _load_json(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> Optional[str]:
    """``"<s>"`` or ``{"content": "<s>", ...}`` (an AddedToken as saved) -> ``"<s>"``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


# ---------------------------------------------------------------------------------------------
# The public class
# ---------------------------------------------------------------------------------------------


class Tokenizer:
    """Text <-> token ids for one model, backed by a ``tokenizers.Tokenizer``.

    Build it with :meth:`from_gguf` or :meth:`from_hf_dir`.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` doing the work (no truncation, no padding, and
            ``encode`` never lets its post-processor add special tokens).
        bos_token_id: id of the beginning-of-sequence token, or ``None`` if the model has none.
        eos_token_id: id of the end-of-sequence token, or ``None``.
        vocab_size: number of token ids, ``0 <= id < vocab_size`` (may be smaller than the
            model's embedding matrix when that is padded).
        add_bos_default: whether the model's own runtime (llama.cpp for a GGUF, the
            ``transformers`` tokenizer for a folder) puts BOS in front of a prompt by default.
            ``encode`` only adds BOS when asked: pass ``bos=tok.add_bos_default`` (or ``None``)
            to follow the model.
        source: where the tokenizer came from (a path, or ``"<GGUFReader>"``).
    """

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: Optional[int] = None,
        eos_token_id: Optional[int] = None,
        vocab_size: Optional[int] = None,
        add_bos_default: bool = False,
        source: str = "",
    ) -> None:
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.vocab_size = int(vocab_size if vocab_size is not None else backend.get_vocab_size(with_added_tokens=True))
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.add_bos_default = bool(add_bos_default)
        self.source = source

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader_or_path: Any) -> "Tokenizer":
        """Build the tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata.

        Args:
            reader_or_path: an open ``gguf.GGUFReader``, or a path (``str`` / ``os.PathLike``) to
                a ``.gguf`` file. With a path only the metadata section is read (about 0.1 s for a
                49k-token vocabulary; opening a ``GGUFReader`` on the same file takes seconds).

        Returns:
            A :class:`Tokenizer`. ``bos_token_id`` / ``eos_token_id`` come from
            ``tokenizer.ggml.bos_token_id`` / ``eos_token_id`` (``None`` when absent or out of
            range); ``add_bos_default`` from ``tokenizer.ggml.add_bos_token``, else llama.cpp's
            default for the tokenizer type (True for SentencePiece and Llama-3-style BPE).

        Raises:
            ValueError: the file is not a GGUF, carries no tokenizer, or uses a tokenizer model
                (``tokenizer.ggml.model``) or pre-tokenizer (``tokenizer.ggml.pre``) not supported
                here; the message names it.
        """
        if hasattr(reader_or_path, "fields"):
            meta = _reader_metadata(reader_or_path)
            source = str(getattr(reader_or_path, "path", "<GGUFReader>"))
        else:
            meta = _read_gguf_metadata(reader_or_path)
            source = os.fspath(reader_or_path)
        return cls._from_gguf_metadata(meta, source)

    @classmethod
    def _from_gguf_metadata(cls, meta: Dict[str, Any], source: str) -> "Tokenizer":
        model = meta.get("tokenizer.ggml.model")
        if model not in _SUPPORTED_MODELS:
            raise ValueError(
                f"unsupported GGUF tokenizer model tokenizer.ggml.model={model!r} in {source}; "
                f"supported: {list(_SUPPORTED_MODELS)}"
            )
        tokens = _token_list(meta)
        types = _token_types(meta, len(tokens))
        if model == "gpt2":
            backend, add_bos = _build_gpt2(meta, tokens, types)
        else:
            backend, add_bos = _build_llama(meta, tokens, types)
        _register_added_tokens(backend, tokens, types)
        if "tokenizer.ggml.add_bos_token" in meta:
            add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
        n = len(tokens)
        return cls(
            backend,
            bos_token_id=_opt_id(meta, "tokenizer.ggml.bos_token_id", n),
            eos_token_id=_opt_id(meta, "tokenizer.ggml.eos_token_id", n),
            vocab_size=n,
            add_bos_default=add_bos,
            source=source,
        )

    @classmethod
    def from_hf_dir(cls, path: Union[str, os.PathLike]) -> "Tokenizer":
        """Load a Hugging Face tokenizer folder (or a ``tokenizer.json`` file path).

        ``tokenizer.json`` is required. BOS/EOS are looked up, in order, in
        ``tokenizer_config.json`` (``bos_token`` / ``eos_token``), ``special_tokens_map.json``
        and ``config.json`` (``bos_token_id`` / ``eos_token_id``; a list of EOS ids gives its
        first). ``add_bos_default`` is ``tokenizer_config.json``'s ``add_bos_token`` when set,
        else whether the file's post-processor puts BOS in front of a sequence.

        Raises:
            FileNotFoundError: there is no ``tokenizer.json``.
        """
        from tokenizers import Tokenizer as _Backend

        p = Path(path)
        folder, tj = (p.parent, p) if p.is_file() else (p, p / "tokenizer.json")
        if not tj.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        backend = _Backend.from_file(str(tj))
        tcfg = _load_json(folder / "tokenizer_config.json")
        smap = _load_json(folder / "special_tokens_map.json")
        mcfg = _load_json(folder / "config.json")

        def lookup(name: str) -> Optional[int]:
            for source in (tcfg, smap):
                content = _token_content(source.get(name))
                if content is not None:
                    tid = backend.token_to_id(content)
                    if tid is not None:
                        return tid
            v = mcfg.get(f"{name}_id")
            if isinstance(v, list):
                v = v[0] if v else None
            return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

        bos, eos = lookup("bos_token"), lookup("eos_token")
        if isinstance(tcfg.get("add_bos_token"), bool):
            add_bos = tcfg["add_bos_token"]
        else:
            add_bos = False
            if bos is not None:
                with_special = backend.encode("a", add_special_tokens=True).ids
                add_bos = bool(with_special) and with_special[0] == bos and backend.encode(
                    "a", add_special_tokens=False
                ).ids[:1] != [bos]
        return cls(backend, bos_token_id=bos, eos_token_id=eos, add_bos_default=add_bos, source=str(folder))

    # -- use ----------------------------------------------------------------------------------

    def encode(self, text: str, bos: Optional[bool] = False) -> np.ndarray:
        """Token ids of ``text``.

        Args:
            text: the text; special tokens written in it (e.g. ``"<|im_start|>"``) become their
                single ids.
            bos: prepend ``bos_token_id``. ``None`` follows ``add_bos_default``. No other
                special token (EOS, template) is ever added.

        Returns:
            ``np.ndarray`` of dtype ``int64`` and shape ``(T,)`` (``T`` may be 0 for ``""``).

        Raises:
            TypeError: ``text`` is not a ``str``.
            ValueError: ``bos`` is requested but the model has no BOS token.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        if bos is None:
            bos = self.add_bos_default
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if bos:
            if self.bos_token_id is None:
                raise ValueError(f"bos=True, but this tokenizer ({self.source}) has no BOS token")
            ids = [self.bos_token_id] + ids
        return np.asarray(ids, dtype=np.int64).reshape(-1)

    def decode(self, ids: Any) -> str:
        """Text of a sequence of token ids (any 1-D integer array-like, or a single int).

        Special tokens are written out (``"<|im_end|>"``), so ``decode(encode(s)) == s`` for
        any text with byte-level BPE vocabularies, and for SentencePiece ones when ``s`` has no
        special tokens (the word-start ``▁`` after a special token decodes to a space). Pieces
        that do not complete a UTF-8 character decode to U+FFFD.

        Raises:
            ValueError: ``ids`` is not 1-D integer data, or an id is outside ``[0, vocab_size)``.
        """
        arr = np.asarray(ids)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise ValueError(f"decode() takes a 1-D sequence of ids, got shape {arr.shape}")
        if arr.size == 0:
            return ""
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"decode() takes integer ids, got dtype {arr.dtype}")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside [0, {self.vocab_size})")
        return self.backend.decode(arr.tolist(), skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> Optional[str]:
        """The vocabulary string of one id (byte-level spelling, e.g. ``"Ġthe"``), or ``None``."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of one vocabulary string, or ``None`` if it is not a token."""
        return self.backend.token_to_id(token)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos_token_id={self.bos_token_id}, "
            f"eos_token_id={self.eos_token_id}, add_bos_default={self.add_bos_default}, source={self.source!r})"
        )
