"""The tokenizer's view of a GGUF file: ``general.architecture`` and the ``tokenizer.*``
metadata, read through :class:`sinklab.io.gguf_reader.GGUFFile` (shared with
:mod:`sinklab.io.gguf_loader`; a ``gguf.GGUFReader`` is accepted too), plus the small helpers that interpret it the way llama.cpp does."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import numpy as np

from ..io.gguf_loader import open_gguf
from ..io.gguf_reader import GGUFFile

SUPPORTED_MODELS = ("gpt2", "llama")

# llama.cpp token types (tokenizer.ggml.token_type)
TT_CONTROL = 3
TT_USER_DEFINED = 4

# numpy dtype of each fixed-size GGUF value type (for empty arrays)
_GGUF_NP = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8", 11: "i8", 12: "f8"}


def _wanted_key(key: str) -> bool:
    return key == "general.architecture" or key.startswith("tokenizer.")


def _field_value(field: Any) -> Any:
    """The value of one ``gguf.ReaderField`` as plain Python: str, int/float/bool, a list of str
    for string arrays, a native-endian numpy array for numeric arrays."""
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


# The value kinds the tokenizer builders rely on, checked once here so that a hostile file gives
# a ValueError naming the key rather than a TypeError deep inside the builders.
_STR_KEYS = ("general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre")
_STR_LIST_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
_INT_ARRAY_KEYS = ("tokenizer.ggml.token_type",)
_NUM_ARRAY_KEYS = ("tokenizer.ggml.scores",)
_FLAG_PREFIX = "tokenizer.ggml.add_"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_metadata(meta: Dict[str, Any], source: str = "GGUF") -> Dict[str, Any]:
    """Checks the kind of every tokenizer value the builders read: strings for the model names,
    lists of str for tokens and merges, 1-D integer / numeric arrays for token types and scores,
    integers for ``*_token_id`` and booleans (or integers) for ``add_*`` flags.

    Returns:
        ``meta`` itself.

    Raises:
        ValueError: a value of the wrong kind; the message names the key and what it holds.
    """
    def bad(key: str, want: str) -> ValueError:
        v = meta[key]
        return ValueError(f"{source}: metadata {key} should be {want}, holds {type(v).__name__} "
                          f"{str(v)[:60]!r}")

    for key, v in meta.items():
        if key in _STR_KEYS and not isinstance(v, str):
            raise bad(key, "a string")
        if key in _STR_LIST_KEYS and not (isinstance(v, list) and all(isinstance(t, str) for t in v)):
            raise bad(key, "an array of strings")
        if key in _INT_ARRAY_KEYS and not (isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu"):
            raise bad(key, "an array of integers")
        if key in _NUM_ARRAY_KEYS and not (isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iuf"):
            raise bad(key, "an array of numbers")
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id") and not _is_int(v):
            raise bad(key, "an integer")
        if key.startswith(_FLAG_PREFIX) and not isinstance(v, (bool, np.bool_)) and not _is_int(v):
            raise bad(key, "a boolean")
    return meta


def read_metadata(reader_or_path: Any) -> Dict[str, Any]:
    """``general.architecture`` and every ``tokenizer.*`` key of a GGUF file.

    Args:
        reader_or_path: an open :class:`~sinklab.io.gguf_reader.GGUFFile` (what :func:`sinklab.load`
            already holds) or ``gguf.GGUFReader``,
            or a path to a ``.gguf`` file, opened with :func:`sinklab.io.gguf_loader.open_gguf`.

    Returns:
        {key: value}, values as :func:`_field_value` gives them, their kinds checked by
        :func:`check_metadata`.

    Raises:
        ValueError: the file is not a well-formed GGUF (``GGUFError``) or a tokenizer value has
            the wrong kind.
        FileNotFoundError: ``reader_or_path`` is a path that does not exist.
    """
    if not hasattr(reader_or_path, "fields"):
        reader_or_path = open_gguf(os.fspath(reader_or_path))
    source = str(getattr(reader_or_path, "path", "GGUF"))
    if isinstance(reader_or_path, GGUFFile):  # values already plain: str, numbers, lists, arrays
        meta = {key: value for key, value in reader_or_path.fields.items() if _wanted_key(key)}
    else:
        meta = {key: _field_value(field) for key, field in reader_or_path.fields.items() if _wanted_key(key)}
    return check_metadata(meta, source)


def token_list(meta: Dict[str, Any]) -> List[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError("GGUF has no tokenizer.ggml.tokens: it carries no tokenizer")
    # llama.cpp renames empty tokens the same way; an empty string cannot be a BPE token.
    return [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def token_types(meta: Dict[str, Any], n: int) -> np.ndarray:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return np.ones(n, dtype=np.int32)
    types = np.asarray(types)
    if types.shape != (n,):
        raise ValueError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
    return types



def register_added_tokens(backend, tokens: List[str], types: np.ndarray) -> None:
    from tokenizers import AddedToken

    control = [AddedToken(tokens[i], special=True, normalized=False) for i in np.nonzero(types == TT_CONTROL)[0]]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.nonzero(types == TT_USER_DEFINED)[0]]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)


def opt_id(meta: Dict[str, Any], key: str, n: int) -> Optional[int]:
    v = meta.get(key)
    if v is None:
        return None
    v = int(v)
    return v if 0 <= v < n else None

