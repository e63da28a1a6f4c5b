"""Model inputs in one place: text (or token ids) -> the checked token ids a model runs on, and
the names of the two BOS conditions every analysis compares.

**The BOS rule.** ``prepare(model, x, bos, max_tokens)`` returns at most ``max_tokens`` ids and
the BOS, when ``bos`` is true, *counts among them*: ``[BOS] + the first max_tokens - 1 text
tokens``, or ``the first max_tokens text tokens`` without BOS. So with and without BOS the model
sees sequences of the same length and position j >= 1 holds the same kind of token. An analysis
that wants the BOS *on top* of T text tokens asks for ``max_tokens = T + 1``.

Text is always tokenized without the tokenizer's own BOS; given token ids are taken to be text
ids (no BOS) and are checked (1-D integers inside the vocabulary) exactly as text ids are.

**The two conditions.** ``"bos"`` (the model's BOS prepended) and ``"nobos"`` (text only) are the
only keys used for "with BOS" / "without BOS" in results, dicts and saved files
(:data:`CONDITIONS`); :func:`conditions` turns the usual ``bos=True | False | "both"`` argument
into the list of them. The older spellings ``"with_bos"`` / ``"without_bos"`` are accepted on
read (:func:`condition`, :class:`ByCondition`, loaders of saved files) so that old files and
code keep working.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

BOS, NOBOS = "bos", "nobos"
CONDITIONS = (BOS, NOBOS)
LABELS = {BOS: "with BOS", NOBOS: "without BOS"}
LEGACY = {"with_bos": BOS, "without_bos": NOBOS}

TextOrIds = Union[str, Sequence[int], np.ndarray]


class InputTypeError(TypeError, ValueError):
    """Neither a string nor a 1-D integer sequence of token ids (a TypeError, and a ValueError
    for callers that caught the ValueError the older per-analysis helpers raised)."""
BosArg = Union[bool, str]


def condition(bos: Union[bool, str]) -> str:
    """The condition key for ``bos``: ``True`` -> ``"bos"``, ``False`` -> ``"nobos"``; a key
    (``"bos"``/``"nobos"``, or the legacy ``"with_bos"``/``"without_bos"``) is returned as its
    canonical key. ValueError otherwise."""
    if bos is True:
        return BOS
    if bos is False:
        return NOBOS
    if isinstance(bos, str) and (bos in CONDITIONS or bos in LEGACY):
        return LEGACY.get(bos, bos)
    raise ValueError(f"unknown BOS condition {bos!r}; expected True, False, 'bos' or 'nobos'")


def conditions(bos: BosArg) -> List[str]:
    """``True`` -> ``["bos"]``, ``False`` -> ``["nobos"]``, ``"both"`` -> ``["bos", "nobos"]``."""
    if isinstance(bos, str) and bos == "both":
        return list(CONDITIONS)
    if isinstance(bos, bool):
        return [condition(bos)]
    raise ValueError(f"bos must be True, False or 'both', got {bos!r}")


class ByCondition(dict):
    """A dict keyed by condition (``"bos"``/``"nobos"``) that also answers the legacy keys
    ``"with_bos"``/``"without_bos"`` on read (never stored)."""

    def __missing__(self, key: Any) -> Any:
        if key in LEGACY:
            return self[LEGACY[key]]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, LEGACY.get(key, key) if isinstance(key, str) else key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default


def by_condition(d: Dict[str, Any]) -> ByCondition:
    """``d`` re-keyed by canonical condition names (legacy keys of old files are renamed)."""
    return ByCondition({condition(k) if isinstance(k, str) and (k in LEGACY or k in CONDITIONS) else k: v
                        for k, v in d.items()})


def text_ids(model: Any, text_or_ids: TextOrIds) -> np.ndarray:
    """Text token ids (n,) int64, without BOS and uncut: a string tokenized without BOS, or given
    ids checked to be a non-empty 1-D integer sequence inside the vocabulary."""
    if isinstance(text_or_ids, str):
        ids = np.asarray(model.tokenize(text_or_ids, bos=False), dtype=np.int64).reshape(-1)
    else:
        ids = np.asarray(text_or_ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise InputTypeError(f"expected a string or a 1-D integer array of token ids, got shape "
                            f"{ids.shape} dtype {ids.dtype}")
        ids = ids.astype(np.int64)
        if ids.size:
            lo, hi, V = int(ids.min()), int(ids.max()), int(model.config.vocab_size)
            if lo < 0 or hi >= V:
                raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {V})")
    if ids.size == 0:
        raise ValueError("the text has no tokens")
    return ids


def prepare(model: Any, text_or_ids: TextOrIds, bos: Union[bool, str],
            max_tokens: Optional[int] = None) -> np.ndarray:
    """The token ids (T,) int64 the model runs on for one text, with or without its BOS.

    Args:
        model: a :class:`sinklab.Model` (its tokenizer, BOS id, vocabulary and context length).
        text_or_ids: a string (tokenized without BOS) or text token ids (without BOS).
        bos: prepend the model's BOS (``True``/``"bos"``) or not (``False``/``"nobos"``);
            ValueError when the model has no BOS.
        max_tokens: the most tokens returned, **the BOS included** (see the module docstring);
            None: no cut. Must leave room for one text token (>= 2 with BOS, >= 1 without).

    Returns:
        (T,) int64 with T <= max_tokens: ``[BOS] + text[:max_tokens - 1]`` or ``text[:max_tokens]``.

    Raises:
        ValueError: empty text, ids outside the vocabulary, a model without BOS asked for one,
            or a result longer than the model's context length.
    """
    with_bos = condition(bos) == BOS
    bos_id = model.bos_id(True) if with_bos else None
    ids = text_ids(model, text_or_ids)
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
            raise TypeError(f"max_tokens must be an integer, got {max_tokens!r}")
        room = int(max_tokens) - (1 if with_bos else 0)
        if room < 1:
            raise ValueError(f"max_tokens={max_tokens} leaves no room for a text token"
                             f"{' after the BOS' if with_bos else ''}")
        ids = ids[:room]
    out = np.concatenate([[bos_id], ids]).astype(np.int64) if with_bos else ids
    ctx = int(model.config.context_length)
    if len(out) > ctx:
        raise ValueError(f"sequence of {len(out)} tokens{' (BOS included)' if with_bos else ''} exceeds "
                         f"the model's context length {ctx}; pass max_tokens")
    return out


def check_length(model: Any, n_tokens: int, what: str = "sequence") -> None:
    """ValueError when ``n_tokens`` exceeds the model's context length."""
    ctx = model.config.context_length
    if n_tokens > ctx:
        raise ValueError(f"{what} of {n_tokens} tokens exceeds the model's context length {ctx}")


def text_budget(max_tokens: int, bos: Union[bool, str]) -> int:
    """How many text tokens fit in ``max_tokens`` under the BOS rule (one fewer with BOS)."""
    return int(max_tokens) - (1 if condition(bos) == BOS else 0)
