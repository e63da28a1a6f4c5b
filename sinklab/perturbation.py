"""Perturbation propagation with and without a BOS token (PAPER.md §4, the paper's Fig. 2–3).

Take a prompt, replace one word by another with the same number of tokens ("greatest" ->
"best"), or one token by another, run both sequences and measure, for every layer l = 0..L and
every text position j, how far the residual stream moved:

    abs_change[l, j] = || v_j^(l) - ṽ_j^(l) ||_2          (v = original, ṽ = perturbed)
    rel_change[l, j] = abs_change[l, j] / || v_j^(l) ||_2

``v^(l)`` is the residual stream entering layer l (``Trace.resid``): l = 0 is the embeddings,
l = L the output of the last layer before the final norm. This is done once with the model's
BOS token prepended and once without; positions are aligned by dropping the BOS position, so
column j always means the j-th text token (0-based).

Attention smoothness: the entropy (nats) of every attention row of the original prompt, per
layer, head and text query, with and without BOS.

Summaries (the paper's finding is that without BOS a perturbation spreads further and grows
faster over depth, and attention is smoother):

- ``spread(setting)``: per layer, the sum of the (relative, by default) change over the
  positions that the perturbation can reach but did not itself change — text positions after
  the first changed one, excluding the changed ones. Positions before it are exactly unchanged
  (causal attention).
- ``mean_change(setting)``: the same divided by the number of those positions.
- ``spread_ratio()``: per layer, spread without BOS / spread with BOS (> 1: the perturbation
  spreads more without BOS). Layer 0 (embeddings) has no spread in either setting: NaN.
- ``mean_entropy(setting)``: per layer, the mean row entropy over heads and text queries
  1..T-1 (query 0 is skipped: without BOS its row has a single key and entropy 0 by
  construction).

The exact prompt and normalisation of the paper are uncertain (PAPER.md §4); the relative
change and the choice of positions are documented parameters here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .results import load_npz, save_npz, to_jsonable

BosArg = Union[bool, str]
SETTINGS = ("bos", "nobos")
LABELS = {"bos": "with BOS", "nobos": "without BOS"}


# ---------------------------------------------------------------------------------- helpers
def bos_settings(bos: BosArg) -> List[str]:
    """``True`` -> ["bos"], ``False`` -> ["nobos"], ``"both"`` -> ["bos", "nobos"]."""
    if bos is True:
        return ["bos"]
    if bos is False:
        return ["nobos"]
    if isinstance(bos, str) and bos == "both":
        return ["bos", "nobos"]
    raise ValueError(f"bos must be True, False or 'both', got {bos!r}")


def with_setting(model: Any, text_ids: np.ndarray, setting: str) -> np.ndarray:
    """Text token ids (T,) with the model's BOS prepended (``"bos"``) or as they are (``"nobos"``)."""
    ids = np.asarray(text_ids, dtype=np.int64).reshape(-1)
    if setting == "nobos":
        return ids
    if setting != "bos":
        raise ValueError(f"unknown setting {setting!r}; expected 'bos' or 'nobos'")
    return np.concatenate([[model.bos_id(True)], ids]).astype(np.int64)


def check_length(model: Any, n_tokens: int, what: str = "sequence") -> None:
    """ValueError when ``n_tokens`` exceeds the model's context length."""
    ctx = model.config.context_length
    if n_tokens > ctx:
        raise ValueError(f"{what} of {n_tokens} tokens exceeds the model's context length {ctx}")


def text_ids(model: Any, text: Union[str, Sequence[int], np.ndarray]) -> np.ndarray:
    """Token ids (T,) int64 of a text (tokenized without BOS) or of given ids."""
    if isinstance(text, str):
        ids = np.asarray(model.tokenize(text, bos=False), dtype=np.int64)
    else:
        ids = np.asarray(text)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"expected a string or a 1-D integer array of token ids, got shape "
                             f"{ids.shape} dtype {ids.dtype}")
        ids = ids.astype(np.int64)
    if ids.size == 0:
        raise ValueError("the text has no tokens")
    return ids


def row_entropy(attn: np.ndarray) -> np.ndarray:
    """Entropy in nats of every attention row: (..., T, T) -> (..., T) float64, 0·log 0 = 0."""
    a = np.asarray(attn, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(a > 0, -a * np.log(np.where(a > 0, a, 1.0)), 0.0)
    return terms.sum(axis=-1)


def _has_stats(model: Any) -> bool:
    from . import model as model_mod

    return "stats" in getattr(model_mod, "CAPTURES", ())


def run_resid_entropy(model: Any, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """One forward: residual stream (L+1, T, d) float32 and row entropies (L, H, T) float64.

    Uses the streaming ``stats`` capture (no T×T buffer) when the core has it, else the full
    attention.
    """
    if _has_stats(model):
        tr = model.run(ids, capture=("resid", "stats"), progress=False)
        return tr.resid, np.asarray(tr.stats.entropy, dtype=np.float64)
    tr = model.run(ids, capture=("resid", "attn"), progress=False)
    return tr.resid, row_entropy(tr.attn)


def _progress(iterable, enabled: bool, desc: str, total: Optional[int] = None):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False)


# ---------------------------------------------------------------------------------- result
@dataclass
class PerturbationResult:
    """Change of the residual stream under a same-length token perturbation.

    Attributes:
        settings: which runs were made, a subset of ``["bos", "nobos"]``.
        ids, ids_perturbed: (T,) int64 text tokens (no BOS) of the original and perturbed prompt.
        changed: int64 text positions where the two differ.
        abs_change: setting -> (L+1, T) float64, ||v_j^(l) - ṽ_j^(l)||_2 at text position j.
        norm: setting -> (L+1, T) float64, ||v_j^(l)||_2 of the original prompt.
        entropy: setting -> (L, H, T) float64, attention row entropy in nats of the original
            prompt at every text query (the BOS query row is dropped).
        tokens, tokens_perturbed: decoded text tokens, for labels.
        meta: model name, BOS token id, old/new, position, ...
    """

    settings: List[str]
    ids: np.ndarray
    ids_perturbed: np.ndarray
    changed: np.ndarray
    abs_change: Dict[str, np.ndarray]
    norm: Dict[str, np.ndarray]
    entropy: Dict[str, np.ndarray]
    tokens: List[str] = field(default_factory=list)
    tokens_perturbed: List[str] = field(default_factory=list)
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return self.abs_change[self.settings[0]].shape[0] - 1

    @property
    def rel_change(self) -> Dict[str, np.ndarray]:
        """setting -> (L+1, T): abs_change / ||v_j^(l)|| (0 where the norm is 0)."""
        out = {}
        for s in self.settings:
            n = self.norm[s]
            with np.errstate(divide="ignore", invalid="ignore"):
                out[s] = np.where(n > 0, self.abs_change[s] / np.where(n > 0, n, 1.0), 0.0)
        return out

    def change(self, setting: str, relative: bool = True) -> np.ndarray:
        """(L+1, T) relative or absolute change for one setting."""
        self._check_setting(setting)
        return self.rel_change[setting] if relative else self.abs_change[setting]

    def reach_mask(self) -> np.ndarray:
        """(T,) bool: positions the perturbation can reach that it did not change itself."""
        T = len(self.ids)
        m = np.arange(T) > int(self.changed.min())
        m[self.changed] = False
        return m

    def spread(self, setting: str, relative: bool = True) -> np.ndarray:
        """(L+1,) float64: sum of the change over :meth:`reach_mask` positions, per layer."""
        return self.change(setting, relative)[:, self.reach_mask()].sum(axis=1)

    def mean_change(self, setting: str, relative: bool = True) -> np.ndarray:
        """(L+1,) float64: mean change over :meth:`reach_mask` positions (NaN if there are none)."""
        n = int(self.reach_mask().sum())
        if n == 0:
            return np.full(self.n_layers + 1, np.nan)
        return self.spread(setting, relative) / n

    def spread_ratio(self, relative: bool = True) -> np.ndarray:
        """(L+1,) spread without BOS / spread with BOS; NaN where the BOS spread is 0."""
        if set(self.settings) != set(SETTINGS):
            raise ValueError("spread_ratio needs both settings; run perturb(..., bos='both')")
        b, n = self.spread("bos", relative), self.spread("nobos", relative)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(b > 0, n / np.where(b > 0, b, 1.0), np.nan)

    def mean_entropy(self, setting: str) -> np.ndarray:
        """(L,) float64: mean attention row entropy (nats) over heads and text queries 1..T-1."""
        self._check_setting(setting)
        e = self.entropy[setting]
        if e.shape[-1] < 2:
            return e.mean(axis=(1, 2))
        return e[:, :, 1:].mean(axis=(1, 2))

    def summary(self) -> Dict[str, Any]:
        """JSON-ready per-layer numbers: spread, mean change, ratio, entropy."""
        out: Dict[str, Any] = {"meta": self.meta, "changed_positions": self.changed.tolist(),
                               "n_reach_positions": int(self.reach_mask().sum()), "settings": {}}
        for s in self.settings:
            out["settings"][s] = {
                "spread_rel": self.spread(s, True), "spread_abs": self.spread(s, False),
                "mean_rel_change": self.mean_change(s, True),
                "mean_entropy": self.mean_entropy(s),
            }
        if set(self.settings) == set(SETTINGS):
            out["spread_ratio_nobos_over_bos_rel"] = self.spread_ratio(True)
            out["spread_ratio_nobos_over_bos_abs"] = self.spread_ratio(False)
            out["entropy_ratio_nobos_over_bos"] = self.mean_entropy("nobos") / self.mean_entropy("bos")
        return to_jsonable(out)

    def _check_setting(self, setting: str) -> None:
        if setting not in self.settings:
            raise ValueError(f"setting {setting!r} was not run; this result has {self.settings}")

    # -------------------------------------------------------------- persistence
    def save(self, path: str) -> None:
        """Writes an .npz (arrays) with the metadata as embedded JSON; no pickle."""
        arrays = {"ids": self.ids, "ids_perturbed": self.ids_perturbed, "changed": self.changed}
        for s in self.settings:
            arrays[f"abs_change_{s}"] = self.abs_change[s]
            arrays[f"norm_{s}"] = self.norm[s]
            arrays[f"entropy_{s}"] = self.entropy[s]
        save_npz(path, arrays, {"settings": self.settings, "tokens": self.tokens,
                                "tokens_perturbed": self.tokens_perturbed, "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "PerturbationResult":
        a, m = load_npz(path)
        st = list(m["settings"])
        return cls(settings=st, ids=a["ids"], ids_perturbed=a["ids_perturbed"], changed=a["changed"],
                   abs_change={s: a[f"abs_change_{s}"] for s in st}, norm={s: a[f"norm_{s}"] for s in st},
                   entropy={s: a[f"entropy_{s}"] for s in st}, tokens=list(m["tokens"]),
                   tokens_perturbed=list(m["tokens_perturbed"]), meta=dict(m["meta"]))


# ---------------------------------------------------------------------------------- API
def replace_word(text: str, old: str, new: str, occurrence: int = 0) -> str:
    """``text`` with the ``occurrence``-th (0-based) whole-word match of ``old`` replaced by ``new``."""
    if not old:
        raise ValueError("the word to replace is empty")
    left = r"\b" if re.match(r"\w", old[0]) else ""
    right = r"\b" if re.match(r"\w", old[-1]) else ""
    matches = list(re.finditer(left + re.escape(old) + right, text))
    if not matches:
        raise ValueError(f"{old!r} does not occur as a word in the text")
    if not 0 <= occurrence < len(matches):
        raise ValueError(f"{old!r} occurs {len(matches)} time(s); occurrence={occurrence} is out of range")
    m = matches[occurrence]
    return text[:m.start()] + new + text[m.end():]


def _differing_spans(a: np.ndarray, b: np.ndarray) -> Tuple[int, int]:
    """Lengths of the middle parts of two token sequences once their common prefix and suffix are removed."""
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    q = 0
    while q < min(len(a), len(b)) - p and a[len(a) - 1 - q] == b[len(b) - 1 - q]:
        q += 1
    return len(a) - p - q, len(b) - p - q


def _pieces(model: Any, ids: np.ndarray) -> List[str]:
    try:
        return [model.detokenize([int(i)]) for i in ids]
    except Exception:  # no tokenizer
        return [str(int(i)) for i in ids]


def perturb(model: Any, text: Union[str, Sequence[int], np.ndarray], old: Optional[str] = None,
            new: Optional[str] = None, *, position: Optional[int] = None,
            token: Union[int, str, None] = None, bos: BosArg = "both", occurrence: int = 0,
            progress: bool = True) -> PerturbationResult:
    """Runs a prompt and a same-length perturbation of it and measures how the change spreads.

    Two ways to perturb:
      * ``perturb(model, text, "greatest", "best")``: replace the ``occurrence``-th whole-word
        match of ``old`` by ``new``; the two texts must tokenize to the same number of tokens
        (else ValueError stating both counts).
      * ``perturb(model, text_or_ids, position=j, token=t)``: replace the token at text position
        j (0-based, BOS not counted; negative counts from the end) by token id t (or by a string
        that is exactly one token).

    Args:
        model: a :class:`sinklab.Model`.
        text: the prompt (str, tokenized without BOS) or its token ids (T,) without BOS.
        bos: ``True`` (BOS prepended), ``False`` (text only) or ``"both"`` (default).
        progress: tqdm bar over the (up to four) forward passes.

    Returns:
        :class:`PerturbationResult` with per layer l = 0..L and text position j the absolute
        and relative change of the residual stream, row entropies, and summaries.
    """
    settings = bos_settings(bos)
    if (old is None) != (new is None):
        raise ValueError("give both old and new (a word replacement), or position and token")
    word_mode = old is not None
    if word_mode and (position is not None or token is not None):
        raise ValueError("give either old/new or position/token, not both")
    if not word_mode and (position is None or token is None):
        raise ValueError("give old and new (a word replacement), or position and token")

    meta: Dict[str, Any] = {"model": getattr(model, "name", None), "source": getattr(model, "source", None),
                            "bos_token_id": model.config.bos_token_id}
    if word_mode:
        if not isinstance(text, str):
            raise ValueError("a word replacement needs the prompt as a string")
        new_text = replace_word(text, old, new, occurrence)
        ids = text_ids(model, text)
        ids_p = text_ids(model, new_text)
        if len(ids) != len(ids_p):
            a, b = _differing_spans(ids, ids_p)
            raise ValueError(
                f"replacing {old!r} by {new!r} changes the token count: the original prompt has "
                f"{len(ids)} tokens, the perturbed one {len(ids_p)} (here {old!r} is {a} token(s) "
                f"and {new!r} is {b}); choose a replacement with the same number of tokens")
        meta.update(mode="word", old=old, new=new, occurrence=occurrence, text=text, perturbed_text=new_text)
    else:
        ids = text_ids(model, text)
        T = len(ids)
        j = int(position)
        if not -T <= j < T:
            raise ValueError(f"position {position} is outside the prompt's {T} text tokens")
        j %= T
        if isinstance(token, str):
            tok = model.tokenize(token, bos=False)
            if len(tok) != 1:
                raise ValueError(f"replacement {token!r} is {len(tok)} tokens, not one; pass a token id "
                                 f"or a string that is a single token")
            tok_id = int(tok[0])
        else:
            tok_id = int(token)
        if not 0 <= tok_id < model.config.vocab_size:
            raise ValueError(f"token id {tok_id} is outside the vocabulary [0, {model.config.vocab_size})")
        ids_p = ids.copy()
        ids_p[j] = tok_id
        meta.update(mode="token", position=j, token=tok_id, old_token=int(ids[j]),
                    text=text if isinstance(text, str) else None)
    changed = np.nonzero(ids != ids_p)[0].astype(np.int64)
    if changed.size == 0:
        raise ValueError("the perturbation leaves every token unchanged")
    n_bos = 1 if "bos" in settings else 0
    check_length(model, len(ids) + n_bos, "prompt")
    meta["settings"] = settings
    meta["T_text"] = int(len(ids))

    abs_change, norm, entropy = {}, {}, {}
    jobs = [(s, which) for s in settings for which in ("orig", "pert")]
    runs: Dict[Tuple[str, str], Tuple[np.ndarray, np.ndarray]] = {}
    for s, which in _progress(jobs, progress, "perturbation runs"):
        seq = with_setting(model, ids if which == "orig" else ids_p, s)
        runs[(s, which)] = run_resid_entropy(model, seq)
    for s in settings:
        off = 1 if s == "bos" else 0
        r0, e0 = runs[(s, "orig")]
        r1, _ = runs[(s, "pert")]
        v = np.asarray(r0[:, off:, :], dtype=np.float64)
        w = np.asarray(r1[:, off:, :], dtype=np.float64)
        abs_change[s] = np.linalg.norm(v - w, axis=-1)
        norm[s] = np.linalg.norm(v, axis=-1)
        entropy[s] = e0[:, :, off:]
    return PerturbationResult(settings=settings, ids=ids, ids_perturbed=ids_p, changed=changed,
                              abs_change=abs_change, norm=norm, entropy=entropy,
                              tokens=_pieces(model, ids), tokens_perturbed=_pieces(model, ids_p), meta=meta)
