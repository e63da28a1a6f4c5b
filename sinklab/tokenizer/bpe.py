"""Byte-level BPE from GGUF metadata (``tokenizer.ggml.model == "gpt2"``): llama.cpp's
pre-tokenizer regexes per ``tokenizer.ggml.pre`` and the ``tokenizers`` backend built on them."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

import numpy as np

from .gguf_meta import TT_CONTROL, TT_USER_DEFINED

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


def split_merges(merges: Iterable[str]) -> List[Tuple[str, str]]:
    """GGUF merge strings as pairs: ``"a b"`` -> ``("a", "b")``, split at the first space after
    position 0 as llama.cpp does (a string without one is dropped)."""
    out = []
    for m in merges:
        i = m.find(" ", 1)
        if i > 0:
            out.append((m[:i], m[i + 1:]))
    return out


def valid_merges(merges: List[Tuple[str, str]], vocab: Dict[str, int]) -> List[Tuple[str, str]]:
    """Drop merges whose parts or result are not tokens (``tokenizers`` refuses them; llama.cpp
    can never produce a token from them)."""
    return [(a, b) for a, b in merges if a in vocab and b in vocab and (a + b) in vocab]



def build_gpt2(meta: Dict[str, Any], tokens: List[str], types: np.ndarray):
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
        if types[i] not in (TT_CONTROL, TT_USER_DEFINED) and not alphabet.issuperset(tok):
            spelled = "".join(to_unicode[b] for b in tok.encode("utf-8"))
            if spelled not in vocab:
                tok = spelled
        vocab[tok] = i
    merges_raw = meta.get("tokenizer.ggml.merges")
    if merges_raw is None:
        raise ValueError("GGUF tokenizer model 'gpt2' has no tokenizer.ggml.merges")
    merges = valid_merges(split_merges(merges_raw), vocab)

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

