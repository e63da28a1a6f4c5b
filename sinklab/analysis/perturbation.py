"""Perturbation propagation with and without a BOS token (the paper's Fig. 2–3).

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
layer, head and text query, with and without BOS. With BOS each row has one key more than the
same row without BOS (the BOS key), which by itself biases the comparison; so the BOS run also
gets the entropy over *text keys only* (row i restricted to keys 1..i and renormalised), which
has exactly the keys of the no-BOS row (:func:`text_key_entropy`).

Summaries (the paper's finding is that without BOS a perturbation spreads further and grows
faster over depth, and attention is smoother):

- ``spread(setting)``: per layer, the sum of the (relative, by default) change over the
  positions that the perturbation can reach but did not itself change — text positions after
  the first changed one, excluding the changed ones. Positions before it are exactly unchanged
  (causal attention).
- ``mean_change(setting)``: the same divided by the number of those positions.
- ``spread_ratio()``: per layer, spread without BOS / spread with BOS (> 1: the perturbation
  spreads more without BOS). Layer 0 (embeddings) has no spread in either setting: NaN.
- ``mean_entropy(setting, text_keys=False)``: per layer, the mean row entropy over heads and
  text queries 1..T-1 (query 0 is skipped: without BOS its row has a single key and entropy 0
  by construction); ``text_keys=True`` on the BOS run uses the text-key entropy.

One prompt is an anecdote: :func:`perturbation_study` runs many seeded one-word swaps over the
shipped passages (cut to the same number of tokens) and reports the distribution of the spread
ratio over swaps, per layer, and the three entropies.

The paper does not give its prompt or its normalisation (Fig. 2–3 show one prompt on Gemma
7B); the relative change and the choice of positions are documented parameters here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import model as model_mod  # read at call time: tests narrow model_mod.CAPTURES
from ..inputs import CONDITIONS, BosArg, check_length, conditions, prepare, text_ids
from ..batching import max_batch, run_each
from ..progress import progress_bar
from ..prompts import load_passages
from ..results import load_npz, save_npz, to_jsonable
from . import status as S
from .stats import mean_ci
from ..reprs import compact_repr
from ..labels import concat, long_frame

SETTINGS = CONDITIONS   # the condition keys of :mod:`sinklab.inputs` ("bos", "nobos")


# ---------------------------------------------------------------------------------- helpers
def row_entropy(attn: np.ndarray) -> np.ndarray:
    """Entropy in nats of every attention row: (..., T, T) -> (..., T) float64, 0·log 0 = 0."""
    a = np.asarray(attn, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(a > 0, -a * np.log(np.where(a > 0, a, 1.0)), 0.0)
    return terms.sum(axis=-1)


def text_key_entropy(attn: np.ndarray, first: int = 1) -> np.ndarray:
    """Entropy in nats of every attention row over keys ``first..`` only, renormalised.

    With BOS at position 0 (``first=1``), row i becomes q_k = A_ik / sum_{k'=1..i} A_ik' for
    k = 1..i: the distribution over exactly the keys the same query has without BOS.

    Args:
        attn: (..., T, T) attention probabilities (causal, rows summing to 1).
        first: the first key kept.

    Returns:
        (..., T) float64; NaN for rows with no kept key or zero mass on them (rows i < first).
    """
    a = np.asarray(attn, dtype=np.float64)[..., first:]
    mass = a.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = a / np.where(mass > 0, mass, 1.0)
        terms = np.where(q > 0, -q * np.log(np.where(q > 0, q, 1.0)), 0.0)
    return np.where(mass[..., 0] > 0, terms.sum(axis=-1), np.nan)


def _has_stats(model: Any) -> bool:
    return "stats" in getattr(model_mod, "CAPTURES", ())


def run_resid_entropy(model: Any, ids: np.ndarray,
                      text_keys: bool = False) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """One forward: residual stream, row entropies, and (optionally) text-key row entropies.

    Args:
        ids: (T,) token ids as run; with ``text_keys`` position 0 must be the BOS token.
        text_keys: also return :func:`text_key_entropy` (keys 1..i), which needs the full
            attention: L·H·T² float32 (4.5 MB at T = 65 on SmolLM2, 1.1 GB at T = 1024).

    Returns:
        resid (L+1, T, d) float32; entropy (L, H, T) float64 over all keys, from the streaming
        ``stats`` capture (no T×T buffer) when the core has it, else from the full attention;
        text-key entropy (L, H, T) float64 (NaN at query 0) or None.
    """
    tr = model.run(ids, capture=_original_capture(model, text_keys), progress=False)
    return _resid_entropy(tr, text_keys)


def _original_capture(model: Any, text_keys: bool) -> Tuple[str, ...]:
    """What :func:`run_resid_entropy` captures."""
    return ("resid",) + (("stats",) if _has_stats(model) else ()) + \
        (("attn",) if text_keys or not _has_stats(model) else ())


def _resid_entropy(tr: Any, text_keys: bool) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """:func:`run_resid_entropy`'s outputs from the trace of one sequence."""
    ent = np.asarray(tr.stats.entropy, dtype=np.float64) if tr.stats is not None else row_entropy(tr.attn)
    return tr.resid, ent, (text_key_entropy(tr.attn) if text_keys else None)


# ---------------------------------------------------------------------------------- result
@compact_repr
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
            prompt at every text query over all its keys (the BOS query row is dropped).
        entropy_text: ``{"bos": (L, H, T)}`` float64, the BOS run's row entropy over text keys
            only (:func:`text_key_entropy`, keys 1..i renormalised: the keys of the no-BOS row), or
            empty when not computed (``perturb(..., text_entropy=False)`` or no BOS run).
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
    entropy_text: Dict[str, np.ndarray] = field(default_factory=dict)


    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per (setting, stream, text position): ``setting`` (``"bos"``
        / ``"nobos"``), ``stream`` (0..L), ``position``, ``abs_change`` ‖v − ṽ‖, ``norm`` ‖v‖,
        ``rel_change``, ``token`` (the original text token there) and ``changed`` (whether the
        perturbation replaced that token)."""
        rel = self.rel_change
        frames = {}
        for s in self.settings:
            f = long_frame({"abs_change": self.abs_change[s], "norm": self.norm[s], "rel_change": rel[s]},
                           ("stream", "position"))
            if self.tokens:
                f["token"] = np.asarray(self.tokens, dtype=object)[f["position"].to_numpy()]
            f["changed"] = np.isin(f["position"].to_numpy(), np.asarray(self.changed))
            frames[s] = f
        return concat(frames, "setting")

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

    def mean_entropy(self, setting: str, text_keys: bool = False) -> np.ndarray:
        """(L,) float64: mean attention row entropy (nats) over heads and text queries 1..T-1.

        ``text_keys=True``: for ``"bos"`` the entropy over text keys only (the same keys as the
        no-BOS row; ValueError if it was not computed); for ``"nobos"`` every key is a text key,
        so it is the ordinary entropy.
        """
        self._check_setting(setting)
        e = self.entropy[setting]
        if text_keys and setting == "bos":
            if "bos" not in self.entropy_text:
                raise ValueError("text-key entropy was not computed; run perturb(..., text_entropy=True)")
            e = self.entropy_text["bos"]
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
            if s in self.entropy_text:
                out["settings"][s]["mean_entropy_text_keys"] = self.mean_entropy(s, text_keys=True)
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
        for s, e in self.entropy_text.items():
            arrays[f"entropy_text_{s}"] = e
        save_npz(path, arrays, {"settings": self.settings, "tokens": self.tokens,
                                "tokens_perturbed": self.tokens_perturbed, "meta": self.meta})

    @classmethod
    def load(cls, path: str) -> "PerturbationResult":
        a, m = load_npz(path)
        st = list(m["settings"])
        return cls(settings=st, ids=a["ids"], ids_perturbed=a["ids_perturbed"], changed=a["changed"],
                   abs_change={s: a[f"abs_change_{s}"] for s in st}, norm={s: a[f"norm_{s}"] for s in st},
                   entropy={s: a[f"entropy_{s}"] for s in st}, tokens=list(m["tokens"]),
                   tokens_perturbed=list(m["tokens_perturbed"]), meta=dict(m["meta"]),
                   entropy_text={s: a[f"entropy_text_{s}"] for s in st if f"entropy_text_{s}" in a})


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
            text_entropy: bool = True, progress: bool = True) -> PerturbationResult:
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
        text_entropy: with BOS, also the row entropy over text keys only
            (``entropy_text["bos"]``); this captures the full attention of the original BOS run,
            L·H·T² float32 (see :func:`run_resid_entropy`).
        progress: tqdm bar over the (up to four) forward passes.

    Returns:
        :class:`PerturbationResult` with per layer l = 0..L and text position j the absolute
        and relative change of the residual stream, row entropies, and summaries.
    """
    settings = conditions(bos)
    if (old is None) != (new is None):
        raise ValueError("give both old and new (a word replacement), or position and token")
    word_mode = old is not None
    if word_mode and (position is not None or token is not None):
        raise ValueError("give either old/new or position/token, not both")
    if not word_mode and (position is None or token is None):
        raise ValueError("give old and new (a word replacement), or position and token")

    meta: Dict[str, Any] = {"model": getattr(model, "name", None), "source": getattr(model, "source", None),
                            "bos_token_id": model.config.bos_token_id,
                            "bos_token": model.token_text(model.config.bos_token_id)}
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
                    token_text=model.token_text(tok_id), old_token_text=model.token_text(int(ids[j])),
                    text=text if isinstance(text, str) else None)
    changed = np.nonzero(ids != ids_p)[0].astype(np.int64)
    if changed.size == 0:
        raise ValueError("the perturbation leaves every token unchanged")
    n_bos = 1 if "bos" in settings else 0
    check_length(model, len(ids) + n_bos, "prompt")
    meta["settings"] = settings
    meta["T_text"] = int(len(ids))

    orig = {}
    pert = {}
    jobs = [(s, which) for s in settings for which in ("orig", "pert")]
    for s, which in progress_bar(jobs, progress, desc="perturbation runs (original and perturbed, ±BOS)",
                                 unit="run", leave=False):
        if which == "orig":
            orig[s] = run_original(model, ids, s, text_entropy)
        else:
            pert[s] = run_perturbed(model, ids_p, s)
    return compare_runs(model, ids, ids_p, orig, pert, meta)


def run_original(model: Any, ids: np.ndarray, setting: str, text_entropy: bool = True) -> Dict[str, Any]:
    """Forward of the original text ids (T,) in one setting, kept for :func:`compare_runs`.

    Returns a dict: ``resid`` (L+1, T', d) float32 of the run (T' = T, or T+1 with BOS),
    ``norm`` (L+1, T) float64 ||v_j^(l)|| at text positions, ``entropy`` (L, H, T) float64 and,
    with BOS and ``text_entropy``, ``entropy_text`` (L, H, T) float64 at text queries.
    """
    resid, ent, ent_text = run_resid_entropy(model, prepare(model, ids, setting),
                                             text_keys=text_entropy and setting == "bos")
    return _original(setting, resid, ent, ent_text)


def _original(setting: str, resid: np.ndarray, ent: np.ndarray, ent_text: Optional[np.ndarray]) -> Dict[str, Any]:
    """:func:`run_original`'s dict from the run's residual stream and entropies."""
    off = 1 if setting == "bos" else 0
    out = {"resid": resid, "entropy": ent[:, :, off:],
           "norm": np.linalg.norm(np.asarray(resid[:, off:, :], dtype=np.float64), axis=-1)}
    if ent_text is not None:
        out["entropy_text"] = ent_text[:, :, off:]
    return out


def run_perturbed(model: Any, ids_p: np.ndarray, setting: str) -> np.ndarray:
    """Residual stream (L+1, T', d) float32 of the perturbed text ids (T,) in one setting."""
    return model.run(prepare(model, ids_p, setting), capture=("resid",), progress=False).resid


def compare_runs(model: Any, ids: np.ndarray, ids_p: np.ndarray, orig: Dict[str, Dict[str, Any]],
                 pert: Dict[str, np.ndarray], meta: Dict[str, Any]) -> PerturbationResult:
    """A :class:`PerturbationResult` from :func:`run_original` / :func:`run_perturbed` outputs
    keyed by setting (the same settings in both). Arrays of ``orig`` are shared, not copied."""
    settings = [s for s in SETTINGS if s in orig]
    abs_change = {s: _abs_change(orig[s]["resid"], pert[s], s) for s in settings}
    return _result(model, ids, ids_p, orig, abs_change, meta)


def _abs_change(resid: np.ndarray, resid_p: np.ndarray, setting: str) -> np.ndarray:
    """(L+1, T) float64 ||v_j^(l) - ṽ_j^(l)||_2 at the text positions of one setting's runs."""
    off = 1 if setting == "bos" else 0
    v = np.asarray(resid[:, off:, :], dtype=np.float64)
    w = np.asarray(resid_p[:, off:, :], dtype=np.float64)
    return np.linalg.norm(v - w, axis=-1)


def _result(model: Any, ids: np.ndarray, ids_p: np.ndarray, orig: Dict[str, Dict[str, Any]],
            abs_change: Dict[str, np.ndarray], meta: Dict[str, Any]) -> PerturbationResult:
    settings = [s for s in SETTINGS if s in orig]
    return PerturbationResult(settings=settings, ids=ids, ids_perturbed=ids_p,
                              changed=np.nonzero(ids != ids_p)[0].astype(np.int64), abs_change=abs_change,
                              norm={s: orig[s]["norm"] for s in settings},
                              entropy={s: orig[s]["entropy"] for s in settings},
                              entropy_text={s: orig[s]["entropy_text"] for s in settings if "entropy_text" in orig[s]},
                              tokens=_pieces(model, ids), tokens_perturbed=_pieces(model, ids_p), meta=meta)


# ---------------------------------------------------------------------------------- study
#: Word pairs swapped by :func:`perturbation_study`, each used in both directions. Every word is
#: taken with a leading space (a whole word inside a sentence); a pair is used with a model only
#: when both words are one token each in its vocabulary. Chosen to be grammatical substitutes
#: (the swapped text still reads as English), like the paper's "greatest" -> "best".
SWAP_PAIRS: Tuple[Tuple[str, str], ...] = (
    ("he", "she"), ("his", "her"), ("him", "them"), ("they", "we"), ("is", "was"), ("are", "were"),
    ("and", "or"), ("in", "on"), ("with", "without"), ("before", "after"), ("the", "this"),
    ("a", "one"), ("can", "will"), ("could", "would"), ("must", "may"), ("very", "quite"),
    ("great", "little"), ("good", "bad"), ("more", "less"), ("many", "few"), ("first", "last"),
    ("always", "never"), ("young", "old"), ("long", "short"), ("man", "woman"), ("day", "night"),
)


def swap_table(model: Any, pairs: Sequence[Tuple[str, str]] = SWAP_PAIRS) -> Dict[int, int]:
    """token id -> replacement token id for every pair whose two words (with a leading space)
    are one token each in ``model``'s vocabulary; both directions. ValueError if a word occurs
    in two pairs."""
    table: Dict[int, int] = {}
    for a, b in pairs:
        ta, tb = model.tokenize(" " + a, bos=False), model.tokenize(" " + b, bos=False)
        if len(ta) != 1 or len(tb) != 1:
            continue
        ia, ib = int(ta[0]), int(tb[0])
        if ia == ib or ia in table or ib in table:
            raise ValueError(f"swap pair ({a!r}, {b!r}) repeats a word of another pair")
        table[ia], table[ib] = ib, ia
    if not table:
        raise ValueError("no swap pair is one token per word in this model's vocabulary")
    return table


def swap_candidates(model: Any, ids: np.ndarray, table: Dict[int, int], min_after: int = 16) -> List[int]:
    """Text positions j where a swap from ``table`` is valid, in increasing order.

    Valid: 1 <= j <= T-1-min_after (not the first token, which is the sink without BOS, and at
    least ``min_after`` later positions for the perturbation to reach), ``ids[j]`` is in the
    table, the next token does not start with a letter or digit (``ids[j]`` is a whole word,
    not the start of a longer one), and the perturbed text, detokenized and tokenized again, has as many tokens as the
    original text (detokenized and tokenized again) and differs from it exactly at j, so the
    swap is a word swap in the text as well as a one-token swap.
    """
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    base = np.asarray(model.tokenize(model.detokenize(ids.tolist()), bos=False), dtype=np.int64)
    out = []
    for j in range(1, T - min_after):
        if int(ids[j]) not in table:
            continue
        nxt = model.detokenize([int(ids[j + 1])])
        if nxt[:1].isalnum():
            continue
        p = ids.copy()
        p[j] = table[int(ids[j])]
        re_p = np.asarray(model.tokenize(model.detokenize(p.tolist()), bos=False), dtype=np.int64)
        if len(re_p) == len(base) and np.nonzero(re_p != base)[0].tolist() == [j]:
            out.append(j)
    return out


@compact_repr
@dataclass
class PerturbationStudy:
    """Many one-word swaps over many passages, each a :class:`PerturbationResult` (±BOS).

    Attributes:
        results: one :class:`PerturbationResult` per swap (S of them), each with T text tokens
            and both settings; swaps of one passage share their original-run arrays (``norm``,
            ``entropy``, ``entropy_text``).
        passage: (S,) int64, index of each swap's passage in ``meta["passage_indices"]``'s
            source list (the ``passages`` argument, or ``load_passages("sinks")``).
        meta: model, T, seed, swaps_per_passage, min_after, the swap pairs used, the passages
            used and skipped (with the reason), and per swap its position and words.

    Per-layer arrays have L+1 entries for layers l = 0..L (residual stream entering layer l;
    l = 0 is the embeddings, where the spread is 0 in both settings and ratios are NaN) and L
    entries for entropies (one per attention layer).
    """

    results: List[PerturbationResult]
    passage: np.ndarray
    meta: Dict[str, Any] = field(default_factory=dict)

    @property
    def n_swaps(self) -> int:
        return len(self.results)

    @property
    def n_passages(self) -> int:
        return len(np.unique(self.passage))

    @property
    def n_layers(self) -> int:
        return self.results[0].n_layers

    def spread_ratios(self, relative: bool = True) -> np.ndarray:
        """(S, L+1) float64: per swap and layer, spread without BOS / spread with BOS
        (:meth:`PerturbationResult.spread_ratio`; > 1: the swap spreads more without BOS)."""
        return np.stack([r.spread_ratio(relative) for r in self.results])

    def mean_changes(self, setting: str, relative: bool = True) -> np.ndarray:
        """(S, L+1) float64: per swap, the mean change over the positions after the swap."""
        return np.stack([r.mean_change(setting, relative) for r in self.results])

    def ratio_stats(self, relative: bool = True) -> Dict[str, np.ndarray]:
        """Distribution over swaps of the spread ratio, per layer: each value (L+1,) float64.

        Keys: ``mean``, ``std`` (sample, ddof=1), ``q10``, ``q50``, ``q90`` (linear
        interpolation), ``geomean`` (exp of the mean log ratio: ratios are skewed),
        ``frac_gt1`` (fraction of swaps with ratio > 1). NaN at layer 0, and at any layer
        where some swap's ratio is undefined (its spread with BOS is 0).
        """
        r = self.spread_ratios(relative)
        ok = np.all(np.isfinite(r), axis=0)
        out: Dict[str, np.ndarray] = {k: np.full(r.shape[1], np.nan) for k in
                                      ("mean", "std", "q10", "q50", "q90", "geomean", "frac_gt1")}
        x = r[:, ok]
        if x.size:
            out["mean"][ok] = x.mean(axis=0)
            out["std"][ok] = x.std(axis=0, ddof=1) if len(x) > 1 else np.nan
            for q in (10, 50, 90):
                out[f"q{q}"][ok] = np.percentile(x, q, axis=0)
            with np.errstate(divide="ignore"):
                out["geomean"][ok] = np.exp(np.log(x).mean(axis=0))
            out["frac_gt1"][ok] = (x > 1).mean(axis=0)
        return out

    def _passage_results(self) -> List[PerturbationResult]:
        """The first swap of every passage (it carries the passage's original-run arrays)."""
        _, first = np.unique(self.passage, return_index=True)
        return [self.results[i] for i in sorted(first)]

    def entropies(self) -> Dict[str, np.ndarray]:
        """Per passage and layer, mean row entropy (nats) of the original prompt over heads and
        text queries 1..T-1: each (P, L) float64.

        ``bos_all_keys``: with BOS, over every key (BOS included); ``bos_text_keys``: with BOS,
        over text keys only, renormalised (the keys of the no-BOS row); ``nobos``: without BOS.
        Compare ``bos_text_keys`` with ``nobos`` (same keys); ``bos_all_keys`` has one key more.
        """
        rs = self._passage_results()
        return {"bos_all_keys": np.stack([r.mean_entropy("bos") for r in rs]),
                "bos_text_keys": np.stack([r.mean_entropy("bos", text_keys=True) for r in rs]),
                "nobos": np.stack([r.mean_entropy("nobos") for r in rs])}

    def mean_entropies(self) -> Dict[str, np.ndarray]:
        """:meth:`entropies` averaged over passages: each (L,) float64 nats."""
        return {k: v.mean(axis=0) for k, v in self.entropies().items()}

    def pooled_ratio_stats(self, relative: bool = True) -> Dict[str, float]:
        """Statistics of the spread ratio over every (swap, layer >= 1) pair: mean, q10, q50,
        q90, geomean, frac_gt1 (as in :meth:`ratio_stats`)."""
        r = self.spread_ratios(relative)[:, 1:]
        r = r[np.isfinite(r)]
        if r.size == 0:
            return {k: float("nan") for k in ("mean", "q10", "q50", "q90", "geomean", "frac_gt1")}
        with np.errstate(divide="ignore"):
            return {"mean": float(r.mean()), "q10": float(np.percentile(r, 10)),
                    "q50": float(np.percentile(r, 50)), "q90": float(np.percentile(r, 90)),
                    "geomean": float(np.exp(np.log(r).mean())), "frac_gt1": float((r > 1).mean())}

    def summary(self) -> Dict[str, Any]:
        """JSON-ready aggregate numbers (no per-swap arrays; see :meth:`to_dict`).

        ``spread_ratio_rel`` / ``spread_ratio_abs``: :meth:`ratio_stats` of the relative /
        absolute change, per layer (lists of L+1, null at layer 0); ``pooled_rel`` /
        ``pooled_abs``: :meth:`pooled_ratio_stats`; ``mean_entropy``: :meth:`mean_entropies`
        (lists of L, nats) and ``mean_entropy_over_layers`` their means over layers.
        """
        ent = self.mean_entropies()
        return to_jsonable({
            "meta": {k: v for k, v in self.meta.items() if k != "swaps"},
            "n_swaps": self.n_swaps, "n_passages": self.n_passages, "T": self.meta.get("T"),
            "spread_ratio_rel": self.ratio_stats(True), "spread_ratio_abs": self.ratio_stats(False),
            "pooled_rel": self.pooled_ratio_stats(True), "pooled_abs": self.pooled_ratio_stats(False),
            "mean_entropy": ent, "mean_entropy_over_layers": {k: float(v.mean()) for k, v in ent.items()},
        })

    def to_dict(self) -> Dict[str, Any]:
        """:meth:`summary` plus per swap: passage, position, old/new token and word, and the
        relative and absolute spread ratio per layer. JSON-ready."""
        out = self.summary()
        rel, ab = self.spread_ratios(True), self.spread_ratios(False)
        out["swaps"] = [dict(sw, spread_ratio=rel[i], spread_ratio_abs=ab[i])
                        for i, sw in enumerate(self.meta.get("swaps", []))]
        out["entropy_per_passage"] = self.entropies()
        return to_jsonable(out)

    # -------------------------------------------------------------- persistence
    def save(self, path: str) -> None:
        """One .npz (per-swap and per-passage arrays) with embedded JSON metadata; no pickle."""
        rs = self.results
        first = self._passage_results()
        arrays: Dict[str, np.ndarray] = {
            "passage": self.passage, "ids": np.stack([r.ids for r in rs]),
            "ids_perturbed": np.stack([r.ids_perturbed for r in rs])}
        for s in SETTINGS:
            arrays[f"abs_change_{s}"] = np.stack([r.abs_change[s] for r in rs])
            arrays[f"norm_{s}"] = np.stack([r.norm[s] for r in first])
            arrays[f"entropy_{s}"] = np.stack([r.entropy[s] for r in first])
        arrays["entropy_text_bos"] = np.stack([r.entropy_text["bos"] for r in first])
        save_npz(path, arrays, {"meta": self.meta, "result_meta": [r.meta for r in rs],
                                "tokens": [r.tokens for r in rs],
                                "tokens_perturbed": [r.tokens_perturbed for r in rs]})

    @classmethod
    def load(cls, path: str) -> "PerturbationStudy":
        a, m = load_npz(path)
        passage = a["passage"]
        order = {int(p): k for k, p in enumerate(sorted(np.unique(passage).tolist()))}
        results = []
        for i in range(len(passage)):
            k = order[int(passage[i])]
            ids, ids_p = a["ids"][i], a["ids_perturbed"][i]
            results.append(PerturbationResult(
                settings=list(SETTINGS), ids=ids, ids_perturbed=ids_p,
                changed=np.nonzero(ids != ids_p)[0].astype(np.int64),
                abs_change={s: a[f"abs_change_{s}"][i] for s in SETTINGS},
                norm={s: a[f"norm_{s}"][k] for s in SETTINGS}, entropy={s: a[f"entropy_{s}"][k] for s in SETTINGS},
                entropy_text={"bos": a["entropy_text_bos"][k]}, tokens=list(m["tokens"][i]),
                tokens_perturbed=list(m["tokens_perturbed"][i]), meta=dict(m["result_meta"][i])))
        return cls(results=results, passage=passage, meta=dict(m["meta"]))


def _study_originals(model: Any, texts: List[np.ndarray], batch_bytes: Optional[int],
                     bar: Any) -> List[Dict[str, Dict[str, Any]]]:
    """Per text, {setting: :func:`run_original`'s dict} (text-key entropy with BOS), batched."""
    out: List[Dict[str, Dict[str, Any]]] = [{} for _ in texts]
    for s in SETTINGS:
        tk = s == "bos"
        seqs = [prepare(model, ids, s) for ids in texts]
        for k, tr in run_each(model, seqs, _original_capture(model, tk), batch_bytes=batch_bytes,
                              progress=False):
            resid, ent, ent_text = _resid_entropy(tr, tk)
            # a copy, so that the batch's other captures (the attention) are freed with it
            out[k][s] = _original(s, np.array(resid), ent, ent_text)
            bar.update(1)
    return out


def _study_changes(model: Any, perturbed: List[np.ndarray], origs: List[Dict[str, Dict[str, Any]]],
                   batch_bytes: Optional[int], bar: Any) -> List[Dict[str, np.ndarray]]:
    """Per perturbed text, {setting: :func:`_abs_change` against its original}, batched."""
    out: List[Dict[str, np.ndarray]] = [{} for _ in perturbed]
    for s in SETTINGS:
        seqs = [prepare(model, ids, s) for ids in perturbed]
        for k, tr in run_each(model, seqs, ("resid",), batch_bytes=batch_bytes, progress=False):
            out[k][s] = _abs_change(origs[k][s]["resid"], tr.resid, s)
            bar.update(1)
    return out


def perturbation_study(model: Any, passages: Optional[Sequence[Union[str, Sequence[int], np.ndarray]]] = None,
                       n_passages: int = 10, swaps_per_passage: int = 3, T: int = 64, seed: int = 0,
                       min_after: int = 16, pairs: Sequence[Tuple[str, str]] = SWAP_PAIRS,
                       progress: bool = True, batch_bytes: Optional[int] = None) -> PerturbationStudy:
    """Spread of one-word swaps with and without BOS over many passages (default 30 swaps on 10).

    Protocol: each passage is tokenized without BOS and cut to its first ``T`` text tokens
    (passages with fewer are skipped), so every swap sees the same context length. A swap
    replaces the token of one whole word by its partner in ``pairs`` (one token each, e.g.
    " he" <-> " she"; :data:`SWAP_PAIRS`) at a position chosen by :func:`swap_candidates`
    (1 <= j <= T-1-``min_after``, and the swapped text re-tokenizes to the same length, differing
    only at j). Per passage, ``swaps_per_passage`` distinct positions are drawn uniformly without
    replacement with ``numpy.random.default_rng([seed, i])`` (i: the passage's index in
    ``passages``), so the swaps are reproducible and do not depend on which other passages are
    used; passages with fewer valid positions are skipped (recorded in ``meta["skipped"]``) and
    the next one is taken, until ``n_passages`` are used.

    Runs: per passage the original with BOS (residual stream, attention for the text-key
    entropy, streaming stats) and without, then per swap the perturbed text both ways:
    2 + 2·swaps_per_passage forwards of T or T+1 tokens per passage.

    Args:
        model: a :class:`sinklab.Model`.
        passages: texts (str) or text token ids; default ``sinklab.prompts.load_passages("sinks")``.
        n_passages: passages to use (>= 1).
        swaps_per_passage: swaps per passage (>= 1).
        T: text tokens per passage (>= min_after + 2).
        seed: seeds the choice of positions.
        min_after: positions after the swap that the perturbation can reach, at least.
        pairs: the word pairs to swap (see :func:`swap_table`).
        progress: tqdm bar over the forward runs.
        batch_bytes: cap in bytes on one forward call's captures; the runs of equal length
            (all originals with BOS, all without, all perturbed texts with BOS, ...) go
            together in batches of as many as fit (default :data:`sinklab.batching.BATCH_BYTES`,
            256 MiB). The results are bitwise those of one run at a time, for any cap.

    Returns:
        :class:`PerturbationStudy` with ``n_passages * swaps_per_passage`` swaps.
    """
    if n_passages < 1 or swaps_per_passage < 1:
        raise ValueError(f"n_passages and swaps_per_passage must be >= 1, got {n_passages}, {swaps_per_passage}")
    if T < min_after + 2:
        raise ValueError(f"T={T} leaves no position with {min_after} positions after it; use T >= {min_after + 2}")
    check_length(model, T + 1, "BOS + T text tokens")
    if passages is None:
        passages = load_passages("sinks")
        source = "load_passages('sinks')"
    else:
        source = "passages argument"
    table = swap_table(model, pairs)
    skipped: List[Dict[str, Any]] = []
    results: List[PerturbationResult] = []
    passage_idx: List[int] = []
    swaps: List[Dict[str, Any]] = []
    base_meta = {"model": getattr(model, "name", None), "source": getattr(model, "source", None),
                 "bos_token_id": model.config.bos_token_id, "bos_token": model.token_text(model.config.bos_token_id),
                 "mode": "token", "T_text": int(T),
                 "settings": list(SETTINGS)}
    plan: List[Tuple[int, np.ndarray, List[int]]] = []      # (passage, text ids, swap positions)
    for i, text in enumerate(passages):                     # choose everything before running
        if len(plan) == n_passages:
            break
        ids = text_ids(model, text)
        if len(ids) < T:
            skipped.append({"passage": i, "reason": f"{len(ids)} tokens < T={T}"})
            continue
        ids = ids[:T]
        cand = swap_candidates(model, ids, table, min_after)
        if len(cand) < swaps_per_passage:
            skipped.append({"passage": i, "reason": f"{len(cand)} valid swap positions < {swaps_per_passage}"})
            continue
        rng = np.random.default_rng([int(seed), i])
        plan.append((i, ids, sorted(int(j) for j in rng.choice(cand, size=swaps_per_passage, replace=False))))
    used = [i for i, _, _ in plan]
    # Passages run in groups, each group's forwards batched; a group holds as many passages as
    # one batch of their original BOS runs (the largest capture) fits under batch_bytes, so
    # memory stays bounded however many passages there are.
    group = max_batch(model, T + 1, _original_capture(model, True), batch_bytes=batch_bytes)
    bar = progress_bar(None, progress, desc="perturbation study (forward runs)",
                       total=len(plan) * 2 * (1 + swaps_per_passage), unit="run", leave=False)
    try:
        for g in range(0, len(plan), group):
            part = plan[g:g + group]
            orig = _study_originals(model, [ids for _, ids, _ in part], batch_bytes, bar)
            swaps_g = [(k, j) for k, (_, _, chosen) in enumerate(part) for j in chosen]
            perturbed = [part[k][1].copy() for k, _ in swaps_g]
            for p_ids, (k, j) in zip(perturbed, swaps_g):
                p_ids[j] = table[int(part[k][1][j])]
            change = _study_changes(model, perturbed, [orig[k] for k, _ in swaps_g], batch_bytes, bar)
            for (k, j), ids_p, ch in zip(swaps_g, perturbed, change):
                i, ids = part[k][0], part[k][1]
                swaps.append({"passage": i, "position": j, "old_token": int(ids[j]), "new_token": int(ids_p[j]),
                              "old": model.detokenize([int(ids[j])]), "new": model.detokenize([int(ids_p[j])])})
                meta = dict(base_meta, position=j, token=int(ids_p[j]), old_token=int(ids[j]), passage=i,
                            token_text=swaps[-1]["new"], old_token_text=swaps[-1]["old"])
                results.append(_result(model, ids, ids_p, orig[k], ch, meta))
                passage_idx.append(i)
    finally:
        bar.close()
    if len(used) < n_passages:
        raise ValueError(f"only {len(used)} of the {len(passages)} passages have >= {T} tokens and >= "
                         f"{swaps_per_passage} valid swap positions; {n_passages} were requested")
    pair_words = [(a, b) for a, b in pairs if len(model.tokenize(" " + a, bos=False)) == 1
                  and len(model.tokenize(" " + b, bos=False)) == 1]
    meta = {"model": getattr(model, "name", None), "bos_token_id": model.config.bos_token_id, "T": int(T),
            "seed": int(seed), "n_passages": int(n_passages), "swaps_per_passage": int(swaps_per_passage),
            "min_after": int(min_after), "pairs": pair_words, "passage_source": source,
            "passage_indices": used, "skipped": skipped, "swaps": swaps}
    return PerturbationStudy(results=results, passage=np.asarray(passage_idx, dtype=np.int64), meta=meta)


# ---------------------------------------------------------------------- status criterion
def spread_log_ratio_by_passage(study: PerturbationStudy, relative: bool = True) -> np.ndarray:
    """(P,) float64: per passage, the mean over its swaps and layers l >= 1 of
    log(spread without ⟨bos⟩ / spread with ⟨bos⟩) (> 0: the swap spreads further without ⟨bos⟩).
    Swaps of one passage share its text, so the passage is the unit of resampling."""
    r = study.spread_ratios(relative)[:, 1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.where(np.isfinite(r) & (r > 0), np.log(r), np.nan)
    return np.array([np.nanmean(lr[study.passage == p]) for p in np.unique(study.passage)])


def entropy_change_by_passage(study: PerturbationStudy) -> np.ndarray:
    """(P,) float64 nats: per passage, mean attention entropy without ⟨bos⟩ minus with ⟨bos⟩ on
    the same (text) keys, over layers, heads and text queries (> 0: smoother without ⟨bos⟩)."""
    e = study.entropies()
    return (e["nobos"] - e["bos_text_keys"]).mean(axis=1)


def criterion_fig23(study: PerturbationStudy, trained_with_bos: Optional[bool]) -> Dict[str, Any]:
    """Fig. 2–3's two claims as verdicts: without ⟨bos⟩ (a) a one-word perturbation spreads
    further (mean log spread ratio over passages > 0) and (b) attention is smoother (entropy on
    the same keys rises). Tested only on a model trained with a fixed ⟨bos⟩ (the paper's Gemma);
    on one trained without, the paper predicts no difference (the sink moves to the first text
    token), so its numbers are a contrast and its verdict is "not testable here".

    Returns ``{"spread": Verdict, "entropy": Verdict, "spread_log_ratio": Interval,
    "entropy_change": Interval}``."""
    spread, ent = mean_ci(spread_log_ratio_by_passage(study)), mean_ci(entropy_change_by_passage(study))
    if not trained_with_bos:
        why = ("this model was not trained with a fixed ⟨bos⟩: without it the sink moves to the first text token and "
               "the paper predicts no difference" if trained_with_bos is False else
               "whether this model was trained with a fixed ⟨bos⟩ is not recorded")
        return {"spread": S.not_testable(why, numbers={"effect": spread}),
                "entropy": S.not_testable(why, numbers={"effect": ent}),
                "spread_log_ratio": spread, "entropy_change": ent}
    return {"spread": S.directional(spread, +1, "mean log spread ratio (without / with ⟨bos⟩)"),
            "entropy": S.directional(ent, +1, "attention entropy change without ⟨bos⟩ (nats, same keys)"),
            "spread_log_ratio": spread, "entropy_change": ent}
