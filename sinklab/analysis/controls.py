"""Controls for ⟨bos⟩ removal: was the sink lost, or is the first token merely unfamiliar?

Removing the ⟨bos⟩ of a model trained with a fixed one (Gemma) costs perplexity and removes the
sinks on position 0 (the paper's Table 2 and its rebuttal). Two readings fit that alone:

* **H1, identity**: the model has only ever seen ⟨bos⟩ first; any other first token is out of
  distribution, and the loss is that of an unfamiliar input, sink or no sink;
* **H2, the sink**: the heads need a place to park attention (the paper's approximate no-op);
  the loss is that of the lost sink, whatever token is first.

:func:`bos_controls` runs the conditions that pull the two apart on the same predicted tokens
and the same sink prompts, and :func:`criterion_bos_controls` turns them into verdicts.

**Conditions** (:class:`Condition`; :func:`default_conditions` builds the list, any list can be
given). The text is the same in every condition; only what comes before it (the *head*) and the
intervention differ:

=====================  ==========================  =======================================
kind                   head (tokens before text)   what it controls for
=====================  ==========================  =======================================
``bos``                [⟨bos⟩]                     the baseline
``none``               []                          ⟨bos⟩ removal
``replace``            [t]                         another first token (frequent, rare,
                                                   punctuation, newline, padding, ⟨eos⟩)
``prefix``             [p_1..p_m, ⟨bos⟩]           ⟨bos⟩ present but not first
``value``              [⟨bos⟩]                     ⟨bos⟩'s value vector zeroed (scope
                                                   ``"others"``: for queries ≥ 1; ``"all"``:
                                                   every query) or replaced by the causal
                                                   mean of the others (``"mean"``), on all
                                                   heads, the sink heads, or random heads
=====================  ==========================  =======================================

Sink heads are the heads whose mean a_0 over the baseline's sink prompts exceeds ``eps``. The
random control zeroes as many heads drawn at random from the *non-sink* heads (``draws`` seeded
draws, ``numpy.random.default_rng([seed, draw])``); where there are fewer non-sink heads than
sink heads (Gemma-3-270M: most heads are sink heads) the count is matched on both sides:
``k = min(#sink, #non-sink)`` random non-sink heads against ``k`` random sink heads (condition
group ``"sink_random"``, the same draws), and the all-sink-heads condition is reported beside
them. The comparison is paired over passages and averaged over draws (:meth:`BosControls.
heads_difference`); the spread over draws is reported too.

**Protocol** (the defaults are the table the module was checked against, see the tests):

* perplexity: held-out passages (``load_passages("heldout")``), each tokenized without ⟨bos⟩
  and cut to its first ``max_tokens`` tokens x_0..x_{n-1}; the model reads head + x and the
  predicted tokens are x_1..x_{n-1} in *every* condition (never x_0, which has no counterpart
  without ⟨bos⟩), so ΔNLL between conditions is paired token by token. NLL is
  -log softmax(logits)[x_j] in nats (log-sum-exp in float64);
  per passage the summed NLL and its count; the mean is token-weighted (pooled), its interval a
  bootstrap over passages (:func:`sinklab.analysis.stats.weighted_mean_ci`), perplexity its exp.
* sinks: the ``"sinks"`` passages, each sequence T tokens in all (head + the first T - |head|
  text tokens; T = 64), one forward with ``capture="stats"``: Gu et al.'s a_k for every key.
  Sink rate at a position = fraction of (layer, head) pairs with a_k > eps, per prompt, then a
  bootstrap over prompts. Reported at position 0, at the (moved) ⟨bos⟩ and at the first text
  token.
* where the sink moves (:func:`sink_location`): per (prompt, layer, head) the key with the
  largest mass (``mass="seen"``: Gu's a_k, the mean over the queries that see key k, as
  :func:`sinklab.key_importance`; ``"all"``: m_k = the sum over all T queries / T, which does not
  favour late keys seen by few queries), classed as position 0, the moved ⟨bos⟩, the first text
  token, or elsewhere (the first class that matches, in that order: without ⟨bos⟩ position 0
  *is* the first text token and counts as position 0); the share of heads per class and the mean
  top mass, per prompt, bootstrapped over prompts.
* task: cloze from :mod:`sinklab.analysis.tasks` on the same held-out passages (the items'
  contexts are prefixes of the perplexity texts, so the perplexity forward scores them: no extra
  forward), accuracy with a Wilson interval; or any forced-choice items (``task=`` a callable or
  a list; see :func:`bos_controls`).

Every number is computed per condition from per-passage / per-prompt arrays that
:meth:`BosControls.to_dict` keeps, so the intervals and verdicts are rebuilt exactly on load.
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..batching import run_each
from ..inputs import text_ids
from ..interventions import Intervention, ZERO_FIRST_VALUE_SCOPES
from ..prompts import load_passages
from ..results import load_tagged_json, save_tagged_json, to_jsonable
from . import status as S
from . import tasks
from .quality import log_sum_exp_rows, nll_rows
from .sinkset import key_mass_from_importance
from .stats import Interval, bootstrap, mean_ci, weighted_mean_ci, wilson
from ..reprs import compact_repr

FORMAT = "sinklab.BosControls/1"
KINDS = ("bos", "none", "replace", "prefix", "value")
HEAD_SETS = ("all", "sink", "random", "sink_random")
CLASSES = ("position 0", "⟨bos⟩ (moved)", "first text token", "elsewhere")
CLASS_KEYS = ("pos0", "bos", "text", "elsewhere")
MASSES = ("seen", "all")

QUICK = dict(n_texts=8, max_tokens=96, n_sink=8, draws=2, task_items=48)
QUICK_CONDITIONS = ("bos", "none", "replace_frequent", "replace_rare", "prefix_newline", "zero_others",
                    "zero_all", "mean_others", "sink_heads", "random_heads", "sink_random")
"""The conditions of a quick run (names and groups of :func:`default_conditions`)."""
FULL = dict(n_texts=None, max_tokens=200, n_sink=None, draws=5, task_items=400)

# Thresholds of the criteria, fixed from the hypotheses before any measurement (see
# criterion_bos_controls): "keeps the sink" / "loses it" relative to the baseline's sink rate,
# "costs as much as removal" relative to removal's ΔNLL, and the no-op margin in nats/token.
KEEP_SINK_RATIO = 0.5
COST_RATIO = 0.5
NOOP_MARGIN_NLL = 0.1
REMOVAL_PPL_RATIO = 1.5


# ====================================================================== conditions
@dataclass(frozen=True)
class Condition:
    """One named condition: what comes before the text and what is done to ⟨bos⟩.

    Attributes:
        name: key in results and tables (unique in a run).
        kind: one of :data:`KINDS` (see the module docstring).
        label: words for tables and figures.
        token: ``"replace"``: the token id put where ⟨bos⟩ was.
        prefix: ``"prefix"``: token ids before ⟨bos⟩.
        scope: ``"value"``: ``zero_first_value_scope`` (``"others"``, ``"all"``, ``"mean"``).
        heads: ``"value"``: ``"all"`` heads, the ``"sink"`` heads, ``"random"`` non-sink heads or
            ``"sink_random"`` sink heads (both count-matched, one draw each).
        draw: index of the random draw (``"random"``/``"sink_random"``).
        group: conditions of one group (the draws of one control) are pooled in the table.
    """

    name: str
    kind: str
    label: str = ""
    token: Optional[int] = None
    prefix: Tuple[int, ...] = ()
    scope: Optional[str] = None
    heads: str = "all"
    draw: int = 0
    group: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"condition {self.name!r}: kind {self.kind!r}, expected one of {KINDS}")
        if self.kind == "replace" and self.token is None:
            raise ValueError(f"condition {self.name!r}: a 'replace' condition needs token=")
        if self.kind == "prefix" and not self.prefix:
            raise ValueError(f"condition {self.name!r}: a 'prefix' condition needs prefix= (at least one token)")
        if self.kind == "value":
            if self.scope is None:
                raise ValueError(f"condition {self.name!r}: a 'value' condition needs scope=")
            if self.heads not in HEAD_SETS:
                raise ValueError(f"condition {self.name!r}: heads {self.heads!r}, expected one of {HEAD_SETS}")
        object.__setattr__(self, "prefix", tuple(int(t) for t in self.prefix))

    @property
    def group_key(self) -> str:
        return self.group or self.name

    def head(self, bos_id: Optional[int]) -> Tuple[List[int], Optional[int]]:
        """(tokens before the text, position of ⟨bos⟩ in them or None)."""
        if self.kind == "none":
            return [], None
        if self.kind == "replace":
            return [int(self.token)], None
        if bos_id is None:
            raise ValueError(f"condition {self.name!r} needs the model's ⟨bos⟩, and it has none")
        if self.kind == "prefix":
            return list(self.prefix) + [int(bos_id)], len(self.prefix)
        return [int(bos_id)], 0

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "label": self.label, "token": self.token,
                "prefix": list(self.prefix), "scope": self.scope, "heads": self.heads, "draw": self.draw,
                "group": self.group}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Condition":
        return cls(name=d["name"], kind=d["kind"], label=d.get("label", ""), token=d.get("token"),
                   prefix=tuple(d.get("prefix", ())), scope=d.get("scope"), heads=d.get("heads", "all"),
                   draw=int(d.get("draw", 0)), group=d.get("group", ""))


def build_sequence(cond: Condition, text: Sequence[int], bos_id: Optional[int],
                   total: Optional[int] = None) -> Tuple[np.ndarray, int, Optional[int]]:
    """The ids a condition runs on for one text: (ids, position of the first text token,
    position of ⟨bos⟩ or None). ``total``: cut the text so that head + text has ``total`` tokens
    (the sink prompts); None keeps all of ``text`` (perplexity: the text is cut beforehand, the
    same in every condition)."""
    head, bos_pos = cond.head(bos_id)
    x = np.asarray(text, np.int64).reshape(-1)
    if total is not None:
        room = int(total) - len(head)
        if room < 1:
            raise ValueError(f"condition {cond.name!r}: {len(head)} head tokens leave no room in {total}")
        x = x[:room]
    return np.concatenate([np.asarray(head, np.int64), x]).astype(np.int64), len(head), bos_pos


def _single_token(model, text: str) -> Optional[int]:
    try:
        ids = list(model.tokenize(text, bos=False))
    except Exception:
        return None
    return int(ids[0]) if len(ids) == 1 else None


def rare_token(model) -> Optional[int]:
    """A rare vocabulary token, by a fixed rule: the highest id whose text is a word of three or
    more ASCII letters (optionally after one space) that the tokenizer gives back as exactly that
    id (BPE and SentencePiece vocabularies put their latest, rarest merges last; on Gemma-3 this
    is id 236741 "quorum", on SmolLM2 49151 "ectable"). None if the model has no tokenizer."""
    if model.tokenizer is None:
        return None
    pat = re.compile(r"^ ?[A-Za-z]{3,}$")
    for i in range(int(model.config.vocab_size) - 1, 0, -1):
        try:
            s = model.detokenize([i])
        except Exception:
            continue
        if pat.match(s) and _single_token(model, s) == i:
            return i
    return None


def pad_token(model) -> Optional[int]:
    """The padding token: the config's ``pad_token_id``, else the tokenizer's ``<pad>`` if it has one."""
    pid = getattr(model.config, "pad_token_id", None)
    if pid is not None:
        return int(pid)
    tok = model.tokenizer
    if tok is not None and hasattr(tok, "token_to_id"):
        try:
            t = tok.token_to_id("<pad>")
        except Exception:
            t = None
        if t is not None:
            return int(t)
    return None


def mean_scope_available() -> bool:
    """Whether :class:`sinklab.Intervention` has ``zero_first_value_scope="mean"``."""
    return "mean" in ZERO_FIRST_VALUE_SCOPES


def default_conditions(model, draws: int = 5, tokens: Optional[Dict[str, int]] = None,
                       prefixes: Optional[Dict[str, str]] = None, head_scope: str = "others",
                       mean: Optional[bool] = None) -> List[Condition]:
    """The standard list of conditions for ``model`` (see the module docstring).

    Args:
        draws: random draws of the random-heads controls (0: none).
        tokens: {name: token id} replacing ⟨bos⟩; default ``frequent`` ("The"), ``rare``
            (:func:`rare_token`), ``punctuation`` ("."), ``newline`` ("\\n"), ``padding``
            (:func:`pad_token`, when the model has one), ``eos`` (the model's ⟨eos⟩, when it
            differs from ⟨bos⟩). A name mapped to None is left out.
        prefixes: {name: text} put before ⟨bos⟩; default ``newline`` ("\\n") and ``phrase``
            ("Here is a text.").
        head_scope: the zero_first_value scope of the sink-head and random-head controls.
        mean: include scope "mean" (default: when :func:`mean_scope_available`).
    """
    bos = model.bos_id(True)
    auto: Dict[str, Optional[int]] = {"frequent": _single_token(model, "The"), "rare": rare_token(model),
                                      "punctuation": _single_token(model, "."),
                                      "newline": _single_token(model, "\n"), "padding": pad_token(model)}
    eos = getattr(model.config, "eos_token_id", None)
    auto["eos"] = int(eos) if eos is not None and int(eos) != bos else None
    auto.update(tokens or {})
    out = [Condition("bos", "bos", "⟨bos⟩ (baseline)"), Condition("none", "none", "no ⟨bos⟩")]
    seen = {bos}
    for name, tid in auto.items():
        if tid is None or int(tid) in seen:
            continue
        seen.add(int(tid))
        out.append(Condition(f"replace_{name}", "replace", f"⟨bos⟩ → {model.detokenize([int(tid)])!r} ({name})",
                             token=int(tid)))
    for name, text in (prefixes if prefixes is not None else {"newline": "\n", "phrase": "Here is a text."}).items():
        if text is None:
            continue
        ids = tuple(int(t) for t in model.tokenize(text, bos=False))
        if ids:
            out.append(Condition(f"prefix_{name}", "prefix", f"{text!r} then ⟨bos⟩", prefix=ids))
    out.append(Condition("zero_others", "value", "v(⟨bos⟩) = 0 for queries ≥ 1, all heads", scope="others"))
    out.append(Condition("zero_all", "value", "v(⟨bos⟩) = 0 for every query, all heads", scope="all"))
    if mean if mean is not None else mean_scope_available():
        out.append(Condition("mean_others", "value", "v(⟨bos⟩) = causal mean of v_1..v_i, all heads",
                             scope="mean"))
    out.append(Condition("sink_heads", "value", f"v(⟨bos⟩) = 0 ({head_scope}), sink heads only",
                         scope=head_scope, heads="sink"))
    for d in range(int(draws)):
        out.append(Condition(f"random_heads_{d}", "value", f"v(⟨bos⟩) = 0 ({head_scope}), k random non-sink heads",
                             scope=head_scope, heads="random", draw=d, group="random_heads"))
    for d in range(int(draws)):
        out.append(Condition(f"sink_random_{d}", "value", f"v(⟨bos⟩) = 0 ({head_scope}), k random sink heads",
                             scope=head_scope, heads="sink_random", draw=d, group="sink_random"))
    return out


def random_heads(sink: np.ndarray, k: int, seed: int, draw: int, from_sink: bool = False) -> np.ndarray:
    """(L, H) bool: ``k`` heads drawn without replacement from the non-sink heads (``from_sink``:
    from the sink heads), with ``numpy.random.default_rng([seed, draw])`` (``[seed, draw, 1]``
    for sink heads), so a draw is reproducible and never crosses over."""
    sink = np.asarray(sink, bool)
    pool = np.flatnonzero(sink.reshape(-1) if from_sink else ~sink.reshape(-1))
    k = int(k)
    if k > pool.size:
        raise ValueError(f"cannot draw {k} heads from {pool.size} {'sink' if from_sink else 'non-sink'} heads")
    rng = np.random.default_rng([int(seed), int(draw)] + ([1] if from_sink else []))
    out = np.zeros(sink.size, bool)
    out[rng.choice(pool, size=k, replace=False)] = True
    return out.reshape(sink.shape)


# ====================================================================== where the sink sits
@compact_repr
@dataclass
class SinkLocation:
    """Where each head's attention mass sits, per prompt (P prompts, L layers, H heads).

    Attributes:
        sink0: (P,) fraction of (layer, head) pairs with a_0 > eps.
        sink_bos: (P,) the same at the ⟨bos⟩'s position, or None when there is no ⟨bos⟩.
        sink_text: (P,) the same at the first text token.
        mean_a0: (P,) mean a_0 over (layer, head).
        share: {class key: (P,)} share of (layer, head) pairs whose largest-mass key is in that
            class (:data:`CLASS_KEYS`: position 0, the moved ⟨bos⟩, the first text token, elsewhere).
        top_mass: (P,) mean over (layer, head) of the largest mass.
        head_a0: (L, H) mean a_0 over prompts.
        bos_pos, text_pos, eps, mass, T, min_queries: the setting (:func:`locate`).
        top_counts: (T,) how many (prompt, layer, head) triples have their top key at each position.
    """

    sink0: np.ndarray
    sink_bos: Optional[np.ndarray]
    sink_text: np.ndarray
    mean_a0: np.ndarray
    share: Dict[str, np.ndarray]
    top_mass: np.ndarray
    head_a0: np.ndarray
    bos_pos: Optional[int]
    text_pos: int
    eps: float
    mass: str
    T: int
    min_queries: int = 1
    top_counts: Optional[np.ndarray] = None

    @property
    def n_prompts(self) -> int:
        return int(self.sink0.shape[0])

    def sink_rate(self, where: str = "pos0") -> Optional[Interval]:
        """Sink rate (fraction) with its bootstrap interval over prompts at ``"pos0"``, ``"bos"``
        (None without ⟨bos⟩) or ``"text"``."""
        a = {"pos0": self.sink0, "bos": self.sink_bos, "text": self.sink_text}[where]
        return None if a is None else mean_ci(a)

    def shares(self) -> Dict[str, Interval]:
        return {k: mean_ci(v) for k, v in self.share.items()}

    def to_dict(self) -> Dict[str, Any]:
        return to_jsonable({"sink0": self.sink0, "sink_bos": self.sink_bos, "sink_text": self.sink_text,
                            "mean_a0": self.mean_a0, "share": self.share, "top_mass": self.top_mass,
                            "head_a0": self.head_a0, "bos_pos": self.bos_pos, "text_pos": self.text_pos,
                            "eps": self.eps, "mass": self.mass, "T": self.T,
                            "min_queries": self.min_queries, "top_counts": self.top_counts})

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SinkLocation":
        f = lambda x: None if x is None else np.asarray(x, np.float64)  # noqa: E731
        return cls(sink0=f(d["sink0"]), sink_bos=f(d.get("sink_bos")), sink_text=f(d["sink_text"]),
                   mean_a0=f(d["mean_a0"]), share={k: f(v) for k, v in d["share"].items()},
                   top_mass=f(d["top_mass"]), head_a0=f(d["head_a0"]), bos_pos=d.get("bos_pos"),
                   text_pos=int(d["text_pos"]), eps=float(d["eps"]), mass=d.get("mass", "seen"), T=int(d["T"]),
                   min_queries=int(d.get("min_queries", 1)),
                   top_counts=None if d.get("top_counts") is None else np.asarray(d["top_counts"], np.int64))


def locate(importance: np.ndarray, text_pos: int, bos_pos: Optional[int] = None, eps: float = 0.3,
           mass: str = "seen", bidirectional: bool = False, min_queries: int = 8) -> SinkLocation:
    """:class:`SinkLocation` from Gu's per-key importance a_k, (P, L, H, T) (what ``capture=
    "stats"`` gives as ``stats.importance``, one prompt per row).

    ``mass="seen"`` ranks keys by a_k itself; ``"all"`` by m_k = a_k (T - k) / T, the mass over
    all T queries (:func:`sinklab.analysis.sinkset.key_mass_from_importance`).

    ``min_queries``: only keys seen by at least that many queries compete for the top (causal:
    k <= T - min_queries). With ``mass="seen"`` and ``min_queries=1`` the last key wins whenever
    the last query attends to itself (a_{T-1} is that one weight): on Gemma-3-270M without ⟨bos⟩
    the top key is then one of the last 4 in ~90 % of heads. The default 8 keeps a_k a mean over
    at least 8 queries; position 0, the ⟨bos⟩ and the first text token always compete (T >= 8 +
    their position). ``top_counts`` records how often each position is the top key."""
    if mass not in MASSES:
        raise ValueError(f"mass must be one of {MASSES}, got {mass!r}")
    imp = np.asarray(importance, np.float64)
    if imp.ndim != 4:
        raise ValueError(f"importance must be (prompts, layers, heads, T), got shape {imp.shape}")
    T = imp.shape[-1]
    for name, p in (("text_pos", text_pos), ("bos_pos", bos_pos)):
        if p is not None and not 0 <= int(p) < T:
            raise ValueError(f"{name}={p} outside the {T} positions")
    rate = lambda k: (imp[..., k] > eps).mean(axis=(1, 2))  # noqa: E731
    m = imp if mass == "seen" else key_mass_from_importance(imp, bidirectional)
    if int(min_queries) < 1:
        raise ValueError(f"min_queries must be >= 1, got {min_queries}")
    n_keys = T if bidirectional else max(1, T - int(min_queries) + 1)
    m = m[..., :n_keys]
    top = m.argmax(axis=-1)
    cls = np.full(top.shape, 3, np.int8)
    cls[top == int(text_pos)] = 2
    if bos_pos is not None:
        cls[top == int(bos_pos)] = 1
    cls[top == 0] = 0
    return SinkLocation(sink0=rate(0), sink_bos=None if bos_pos is None else rate(int(bos_pos)),
                        sink_text=rate(int(text_pos)), mean_a0=imp[..., 0].mean(axis=(1, 2)),
                        share={k: (cls == c).mean(axis=(1, 2)) for c, k in enumerate(CLASS_KEYS)},
                        top_mass=m.max(axis=-1).mean(axis=(1, 2)), head_a0=imp[..., 0].mean(axis=0),
                        bos_pos=None if bos_pos is None else int(bos_pos), text_pos=int(text_pos),
                        eps=float(eps), mass=mass, T=int(T), min_queries=int(min_queries),
                        top_counts=np.bincount(top.reshape(-1), minlength=T).astype(np.int64))


def sink_location(model, seqs: Union[np.ndarray, Sequence[Sequence[int]]], text_pos: int,
                  bos_pos: Optional[int] = None, eps: float = 0.3, mass: str = "seen", min_queries: int = 8,
                  intervene: Optional[Intervention] = None, batch_bytes: Optional[int] = None,
                  progress: bool = False, desc: str = "sink location") -> SinkLocation:
    """Where the sink sits on a batch of sequences of equal length: one forward per batch with
    ``capture="stats"`` (no T x T buffer), then :func:`locate`.

    Args:
        model: a :class:`sinklab.Model`.
        seqs: (P, T) token ids as the model runs them (⟨bos⟩ or whatever comes first in place).
        text_pos: position of the first text token (1 after a ⟨bos⟩, 0 without).
        bos_pos: position of ⟨bos⟩ (None when there is none).
        eps, mass, min_queries: see :func:`locate`.
        intervene: an optional :class:`sinklab.Intervention` for every forward.
    """
    arrs = [np.asarray(s, np.int64) for s in seqs]
    if not arrs:
        raise ValueError("seqs is empty")
    if len({len(a) for a in arrs}) != 1:
        raise ValueError("sink_location takes sequences of one length (the positions must mean the same)")
    c = model.config
    imp = np.empty((len(arrs), c.n_layers, c.n_heads, len(arrs[0])), np.float64)
    for i, tr in run_each(model, arrs, ("stats",), intervene=intervene, batch_bytes=batch_bytes,
                          progress=progress, desc=desc, unit="prompt"):
        imp[i] = tr.stats.importance
    return locate(imp, text_pos, bos_pos, eps, mass, bool(c.bidirectional), min_queries)


# ====================================================================== scoring
token_nll = nll_rows  # -log softmax(logits)[target] per row (nats), as the quality analysis scores it


def _log_softmax_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    z = np.asarray(rows, np.float32)
    return z, log_sum_exp_rows(z)


@dataclass
class _Item:
    """A forced-choice item: context ids (no ⟨bos⟩), candidate token arrays, the true index;
    ``passage``/``cut``: where it sits in a perplexity text (cloze shared with the perplexity
    forward), else None."""

    context: np.ndarray
    candidates: List[np.ndarray]
    target: int
    passage: Optional[int] = None
    cut: Optional[int] = None


def _as_item(it: Any) -> _Item:
    if isinstance(it, _Item):
        return it
    if isinstance(it, (tuple, list)) and len(it) == 3:
        ctx, cands, tgt = it
    else:
        ctx = getattr(it, "context", None)
        if ctx is None:
            ctx = getattr(it, "ids")
        cands, tgt = getattr(it, "candidates"), getattr(it, "target")
    return _Item(np.asarray(ctx, np.int64), [np.asarray(c, np.int64).reshape(-1) for c in cands], int(tgt))


def _score_items(model, items: List[_Item], head: List[int], intervene, batch_bytes) -> np.ndarray:
    """(N,) bool: the true candidate has the strictly highest summed log-likelihood after
    head + context (one forward per item when every candidate is one token, else one per candidate)."""
    off = len(head)
    jobs, owner = [], []
    for i, it in enumerate(items):
        if all(len(c) == 1 for c in it.candidates):
            jobs.append(np.concatenate([head, it.context]).astype(np.int64))
            owner.append((i, None))
        else:
            for k, c in enumerate(it.candidates):
                jobs.append(np.concatenate([head, it.context, c]).astype(np.int64))
                owner.append((i, k))
    scores = [np.full(len(it.candidates), np.nan) for it in items]
    lf = [(-1 if k is None else off + len(items[i].context) - 1 - len(jobs[j])) for j, (i, k) in enumerate(owner)]
    for j, tr in run_each(model, jobs, ("logits",), logits_from=lf, intervene=intervene, batch_bytes=batch_bytes,
                          progress=False):
        i, k = owner[j]
        it = items[i]
        if k is None:
            z, lse = _log_softmax_rows(tr.logits[-1:])
            scores[i] = np.array([float(z[0, int(c[0])]) - lse[0] for c in it.candidates])
        else:
            c = it.candidates[k]
            z, lse = _log_softmax_rows(tr.logits[: len(c)])
            scores[i][k] = float(sum(float(z[r, int(c[r])]) - lse[r] for r in range(len(c))))
    return np.array([_strictly_best(s, it.target) for s, it in zip(scores, items)], bool)


def _strictly_best(s: np.ndarray, target: int) -> bool:
    others = np.delete(s, target)
    return bool(np.all(np.isfinite(s)) and (others.size == 0 or s[target] > others.max()))


# ====================================================================== results
@compact_repr
@dataclass
class ConditionResult:
    """One condition's measurements.

    Attributes:
        condition: the :class:`Condition`.
        nll_sum: (N,) summed NLL (nats) of each text's predicted tokens; ``n_tokens`` (N,) their count.
        location: :class:`SinkLocation` on the sink prompts.
        heads: (L, H) bool, the heads intervened on (None: no intervention).
        task_correct: (M,) bool per task item, or None.
        head_ids: the token ids before the text.
        seconds: wall time of this condition.
    """

    condition: Condition
    nll_sum: np.ndarray
    n_tokens: np.ndarray
    location: SinkLocation
    heads: Optional[np.ndarray] = None
    task_correct: Optional[np.ndarray] = None
    head_ids: Tuple[int, ...] = ()
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.condition.name

    @property
    def mean_nll(self) -> Interval:
        return weighted_mean_ci(self.nll_sum, self.n_tokens)

    @property
    def perplexity(self) -> Interval:
        return self.mean_nll.map(math.exp)

    @property
    def task_accuracy(self) -> Optional[Interval]:
        if self.task_correct is None or len(self.task_correct) == 0:
            return None
        return wilson(int(np.sum(self.task_correct)), len(self.task_correct))

    def to_dict(self) -> Dict[str, Any]:
        return to_jsonable({"condition": self.condition.to_dict(), "nll_sum": self.nll_sum,
                            "n_tokens": self.n_tokens, "location": self.location.to_dict(),
                            "heads": None if self.heads is None else self.heads.astype(int),
                            "task_correct": None if self.task_correct is None else self.task_correct.astype(int),
                            "head_ids": list(self.head_ids), "seconds": self.seconds})

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ConditionResult":
        return cls(condition=Condition.from_dict(d["condition"]), nll_sum=np.asarray(d["nll_sum"], np.float64),
                   n_tokens=np.asarray(d["n_tokens"], np.int64), location=SinkLocation.from_dict(d["location"]),
                   heads=None if d.get("heads") is None else np.asarray(d["heads"], bool),
                   task_correct=None if d.get("task_correct") is None else np.asarray(d["task_correct"], bool),
                   head_ids=tuple(d.get("head_ids", ())), seconds=float(d.get("seconds", 0.0)))


def _fmt(iv: Optional[Interval], spec: str = ".1f", scale: float = 1.0, unit: str = "") -> str:
    if iv is None:
        return "—"
    if not np.isfinite(iv.value):
        return "—"
    iv = iv.scaled(scale) if scale != 1.0 else iv
    return iv.fmt(spec, unit)


@dataclass
class BosControls:
    """:func:`bos_controls`' result: every condition, and the numbers the criteria use.

    ``results`` maps condition names to :class:`ConditionResult` in run order; ``sink_heads``
    (L, H) bool are the baseline's sink heads; ``k_matched`` the head count of the random
    controls; ``meta`` the setting (model, eps, T, max_tokens, texts, prompts, seed, timings,
    conditions skipped and why).
    """

    results: Dict[str, ConditionResult]
    sink_heads: np.ndarray
    k_matched: int
    meta: Dict[str, Any] = field(default_factory=dict)
    baseline: str = "bos"

    # -------------------------------------------------------------- access
    def __getitem__(self, name: str) -> ConditionResult:
        return self.results[name]

    def __contains__(self, name: object) -> bool:
        return name in self.results

    @property
    def names(self) -> List[str]:
        return list(self.results)

    def groups(self) -> Dict[str, List[str]]:
        """{group key: [condition names]} in run order (a condition without a group is its own)."""
        out: Dict[str, List[str]] = {}
        for n, r in self.results.items():
            out.setdefault(r.condition.group_key, []).append(n)
        return out

    def _members(self, name_or_group: str) -> List[str]:
        if name_or_group in self.results:
            return [name_or_group]
        g = self.groups().get(name_or_group)
        if not g:
            raise KeyError(f"no condition or group {name_or_group!r}; have {self.names}")
        return g

    def _nll_sums(self, name_or_group: str) -> np.ndarray:
        """(N,) per-text summed NLL, averaged over a group's draws."""
        return np.mean([self.results[n].nll_sum for n in self._members(name_or_group)], axis=0)

    @property
    def n_tokens(self) -> np.ndarray:
        return self.results[self.baseline].n_tokens

    def mean_nll(self, name: str) -> Interval:
        """Token-weighted mean NLL (a group: its draws averaged per text), interval over texts."""
        return weighted_mean_ci(self._nll_sums(name), self.n_tokens)

    def perplexity(self, name: str) -> Interval:
        return self.mean_nll(name).map(math.exp)

    def dnll(self, name: str, ref: Optional[str] = None) -> Interval:
        """Mean NLL of ``name`` minus that of ``ref`` (default the baseline), nats per predicted
        token, paired over texts (the same tokens in both)."""
        ref = ref or self.baseline
        return weighted_mean_ci(self._nll_sums(name) - self._nll_sums(ref), self.n_tokens)

    def dnll_ratio(self, name: str, ref: str = "none") -> Interval:
        """ΔNLL(name) / ΔNLL(ref), both against the baseline, paired over texts (the share of
        removal's loss a condition keeps)."""
        base = self._nll_sums(self.baseline)
        a, b = self._nll_sums(name) - base, self._nll_sums(ref) - base
        def rows(idx: np.ndarray) -> np.ndarray:
            sa, sb = a[idx].sum(axis=1), b[idx].sum(axis=1)
            return np.divide(sa, sb, out=np.full_like(sa, np.nan), where=sb != 0)

        return bootstrap(lambda i: a[i].sum() / b[i].sum() if b[i].sum() != 0 else float("nan"), len(a), rows=rows)

    def heads_difference(self, sink: Optional[str] = None, random: str = "random_heads") -> Interval:
        """ΔNLL(sink-head control) − ΔNLL(random non-sink heads), paired over texts, draws averaged.
        ``sink`` defaults to the count-matched one: ``"sink_random"`` when it ran, else ``"sink_heads"``."""
        if sink is None:
            sink = "sink_random" if "sink_random" in self.groups() else "sink_heads"
        return self.dnll(sink, random)

    def draw_spread(self, group: str, what: str = "perplexity") -> Tuple[float, float, int]:
        """(mean, sample sd, draws) over a group's draws of ``what`` (``"perplexity"``,
        ``"dnll"``, ``"sink0"``)."""
        vals = []
        for n in self._members(group):
            if what == "perplexity":
                vals.append(self.results[n].perplexity.value)
            elif what == "dnll":
                vals.append(self.dnll(n).value)
            elif what == "sink0":
                vals.append(float(self.results[n].location.sink0.mean()))
            else:
                raise ValueError(f"what={what!r}")
        v = np.asarray(vals)
        return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan"), int(v.size)

    def _loc_mean(self, name: str, get: Callable[[SinkLocation], Optional[np.ndarray]]) -> Optional[Interval]:
        arrs = [get(self.results[n].location) for n in self._members(name)]
        if any(a is None for a in arrs):
            return None
        return mean_ci(np.mean(arrs, axis=0))

    def sink_rate(self, name: str, where: str = "pos0") -> Optional[Interval]:
        """Sink rate (fraction) at ``"pos0"``, ``"bos"`` or ``"text"``, interval over prompts
        (a group: its draws averaged per prompt)."""
        key = {"pos0": "sink0", "bos": "sink_bos", "text": "sink_text"}[where]
        return self._loc_mean(name, lambda L: getattr(L, key))

    def sink_rate_ratio(self, name: str, where: Optional[str] = None) -> Interval:
        """Sink rate of ``name`` at its sink candidate (``where``; default the ⟨bos⟩ if it has one,
        else position 0) over the baseline's at position 0, paired over prompts."""
        r = self.results[self._members(name)[0]]
        if where is None:
            where = "bos" if r.location.sink_bos is not None else "pos0"
        key = {"pos0": "sink0", "bos": "sink_bos", "text": "sink_text"}[where]
        num = np.mean([getattr(self.results[n].location, key) for n in self._members(name)], axis=0)
        den = self.results[self.baseline].location.sink0
        def rows(idx: np.ndarray) -> np.ndarray:
            mn, md = num[idx].mean(axis=1), den[idx].mean(axis=1)
            return np.divide(mn, md, out=np.full_like(mn, np.nan), where=md > 0)

        return bootstrap(lambda i: num[i].mean() / den[i].mean() if den[i].mean() > 0 else float("nan"), len(num),
                         rows=rows)

    def mean_a0(self, name: str) -> Optional[Interval]:
        return self._loc_mean(name, lambda L: L.mean_a0)

    def location(self, name: str) -> Dict[str, Interval]:
        """{class key: share of heads whose largest-mass key is in it} and ``"top_mass"``."""
        out = {k: self._loc_mean(name, lambda L, k=k: L.share[k]) for k in CLASS_KEYS}
        out["top_mass"] = self._loc_mean(name, lambda L: L.top_mass)
        return out

    def task_accuracy(self, name: str) -> Optional[Interval]:
        """Wilson interval of the task accuracy (a group: items pooled over draws)."""
        rs = [self.results[n] for n in self._members(name)]
        if any(r.task_correct is None for r in rs):
            return None
        c = np.concatenate([r.task_correct for r in rs])
        return wilson(int(c.sum()), len(c)) if len(c) else None

    def label(self, name: str) -> str:
        ms = self._members(name)
        r = self.results[ms[0]]
        lab = r.condition.label or r.condition.name
        if len(ms) > 1:
            lab += f" ({len(ms)} draws)"
        return lab

    # -------------------------------------------------------------- presentation
    def table(self) -> str:
        """Markdown: per condition (groups pooled over draws) perplexity, ΔNLL vs the baseline,
        sink rates, mean a_0 and task accuracy, each with its 95% interval; then where the sink
        sits."""
        has_task = any(r.task_correct is not None for r in self.results.values())
        eps = self.meta.get("eps", 0.3)
        head = ["condition", "perplexity", "ΔNLL vs ⟨bos⟩ (nats)", f"sink rate pos 0 (ε {eps:g})",
                "sink rate at ⟨bos⟩", "sink rate at 1st text token", "mean a₀"] + (["task accuracy"] if has_task else [])
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for g, ms in self.groups().items():
            ppl = _fmt(self.perplexity(g), ".1f")
            if len(ms) > 1:
                m, sd, n = self.draw_spread(g)
                ppl += f"; sd over draws {sd:.1f}"
            d = "—" if g == self.baseline else _fmt(self.dnll(g), "+.3f")
            cells = [self.label(g), ppl, d, _fmt(self.sink_rate(g, "pos0"), ".1f", 100, "%"),
                     _fmt(self.sink_rate(g, "bos"), ".1f", 100, "%"), _fmt(self.sink_rate(g, "text"), ".1f", 100, "%"),
                     _fmt(self.mean_a0(g), ".3f")]
            if has_task:
                cells.append(_fmt(self.task_accuracy(g), ".1f", 100, "%"))
            rows.append("| " + " | ".join(cells) + " |")
        loc = ["", f"Where the sink sits (per head, the key with the largest "
                   f"{'a_k (mean over the queries that see it)' if self.meta.get('mass', 'seen') == 'seen' else 'm_k (mass over all queries)'}"
                   f" among the keys seen by at least {self.meta.get('min_queries', 1)} queries; "
                   f"share of heads, mean over prompts):", "",
               "| condition | " + " | ".join(CLASSES) + " | mean top mass |", "|" + "---|" * (len(CLASSES) + 2)]
        for g in self.groups():
            L = self.location(g)
            loc.append(f"| {self.label(g)} | " + " | ".join(_fmt(L[k], ".1f", 100, "%") for k in CLASS_KEYS)
                       + f" | {_fmt(L['top_mass'], '.3f')} |")
        foot = [f"", f"{self.meta.get('n_texts', '?')} texts ≤ {self.meta.get('max_tokens', '?')} tokens "
                     f"({int(self.n_tokens.sum())} predicted tokens, the same in every condition); "
                     f"{self.meta.get('n_sink', '?')} sink prompts of T = {self.meta.get('T', '?')}; "
                     f"{int(self.sink_heads.sum())} sink heads of {self.sink_heads.size}, random controls "
                     f"k = {self.k_matched}; 95% bootstrap intervals over texts / prompts"
                     + ("; task: Wilson over items" if has_task else "") + "."]
        skipped = self.meta.get("skipped") or {}
        if skipped:
            foot.append("Not run: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + ".")
        return "\n".join(rows + loc + foot)

    def figure(self, **kw: Any):
        """:func:`sinklab.viz.figures_sinks.bos_controls_figure` of this result."""
        from ..viz.figures_sinks import bos_controls_figure  # needs matplotlib, an optional dependency

        return bos_controls_figure(self, **kw)

    def __repr__(self) -> str:
        b = self.results[self.baseline]
        parts = [f"{self.baseline} ppl {b.perplexity.value:.1f}"]
        for n in ("none", "zero_others", "zero_all"):
            if n in self.results:
                parts.append(f"{n} {self.results[n].perplexity.value:.1f}")
        return (f"BosControls({self.meta.get('model', '?')}, {len(self.results)} conditions, "
                f"{self.meta.get('n_texts', '?')} texts, {self.meta.get('n_sink', '?')} sink prompts; "
                + ", ".join(parts) + ")")

    # -------------------------------------------------------------- persistence
    def to_dict(self) -> Dict[str, Any]:
        return to_jsonable({"format": FORMAT, "baseline": self.baseline, "k_matched": self.k_matched,
                            "sink_heads": self.sink_heads.astype(int), "meta": self.meta,
                            "results": [r.to_dict() for r in self.results.values()]})

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BosControls":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a saved BosControls (format {d.get('format')!r}, expected {FORMAT!r})")
        rs = [ConditionResult.from_dict(r) for r in d["results"]]
        return cls(results={r.name: r for r in rs}, sink_heads=np.asarray(d["sink_heads"], bool),
                   k_matched=int(d["k_matched"]), meta=dict(d.get("meta", {})), baseline=d.get("baseline", "bos"))

    def save(self, path: Union[str, os.PathLike]) -> None:
        save_tagged_json(path, FORMAT, {k: v for k, v in self.to_dict().items() if k != "format"})

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "BosControls":
        return cls.from_dict({"format": FORMAT, **load_tagged_json(path, FORMAT)})


# ====================================================================== the analysis
def _texts(model, texts, n_texts, max_tokens) -> Tuple[List[np.ndarray], List[Any]]:
    raw = list(load_passages("heldout") if texts is None else texts)
    if n_texts is not None:
        raw = raw[: int(n_texts)]
    if not raw:
        raise ValueError("no texts")
    cap = int(max_tokens)
    xs = []
    for i, t in enumerate(raw):
        x = text_ids(model, t)[:cap]
        if len(x) < 2:
            raise ValueError(f"text {i} has {len(x)} token(s); at least 2 are needed to predict one")
        xs.append(x)
    return xs, raw


def _sink_texts(model, prompts, n_sink, T) -> List[np.ndarray]:
    raw = list(load_passages("sinks") if prompts is None else prompts)
    toks = [text_ids(model, p) for p in raw]
    keep = [t for t in toks if len(t) >= T]
    if n_sink is not None:
        keep = keep[: int(n_sink)]
    if not keep:
        raise ValueError(f"no sink prompt has the {T} text tokens needed")
    return keep


def _cloze_items(model, raw_texts, xs, n_items, seed) -> Tuple[List[_Item], int]:
    """Cloze items (tasks.make_cloze_items) on the perplexity texts whose context is a prefix of
    the text and whose candidates are single tokens: scored from the perplexity forward."""
    strs = [t for t in raw_texts if isinstance(t, str)]
    if len(strs) != len(raw_texts):
        raise ValueError("task='cloze' needs the texts as strings")
    max_ctx = min(len(x) for x in xs)
    items = tasks.make_cloze_items(model, n_items=int(n_items), seed=seed, texts=strs,
                                   min_context=min(64, max_ctx - 1), max_context=max(len(x) for x in xs),
                                   max_word_tokens=1)
    out, dropped = [], 0
    for it in items:
        x = xs[it.passage]
        if (it.cut <= len(x) and np.array_equal(x[: it.cut], it.context)
                and all(len(c) == 1 for c in it.candidates)):
            out.append(_Item(np.asarray(it.context, np.int64), [np.asarray(c, np.int64) for c in it.candidates],
                             int(it.target), passage=int(it.passage), cut=int(it.cut)))
        else:
            dropped += 1
    return out, dropped


def _perplexity_and_cloze(model, xs, cond, bos_id, intervene, items_by_text, batch_bytes, progress):
    head, _ = cond.head(bos_id)
    off = len(head)
    seqs = [np.concatenate([np.asarray(head, np.int64), x]) for x in xs]
    sums = np.zeros(len(xs))
    counts = np.asarray([len(x) - 1 for x in xs], np.int64)
    correct: Dict[Tuple[int, int], bool] = {}
    for i, tr in run_each(model, seqs, ("logits",), logits_from=off, intervene=intervene, batch_bytes=batch_bytes,
                          progress=progress, desc=f"perplexity ({cond.name})", unit="text", ragged=True):
        lg = tr.logits                                 # row j predicts x_{j+1}
        sums[i] = token_nll(lg[: len(xs[i]) - 1], xs[i][1:]).sum()
        for j, it in items_by_text.get(i, []):
            z, lse = _log_softmax_rows(lg[it.cut - 1: it.cut])
            s = np.array([float(z[0, int(c[0])]) - lse[0] for c in it.candidates])
            correct[j] = _strictly_best(s, it.target)
    return sums, counts, correct


def _intervention(cond: Condition, sink: np.ndarray, k: int, seed: int) -> Tuple[Optional[Intervention], Optional[np.ndarray]]:
    if cond.kind != "value":
        return None, None
    if cond.heads == "all":
        heads = np.ones(sink.shape, bool)
    elif cond.heads == "sink":
        heads = sink.copy()
    elif cond.heads == "random":
        heads = random_heads(sink, k, seed, cond.draw)
    else:
        heads = random_heads(sink, k, seed, cond.draw, from_sink=True)
    return Intervention(zero_first_value=heads, zero_first_value_scope=cond.scope), heads


def bos_controls(model, conditions: Optional[Sequence[Union[Condition, str]]] = None, *,
                 texts: Optional[Sequence[Any]] = None, sink_prompts: Optional[Sequence[Any]] = None,
                 n_texts: Optional[int] = None, max_tokens: Optional[int] = None, n_sink: Optional[int] = None,
                 T: int = 64, eps: float = 0.3, draws: Optional[int] = None, seed: int = 0,
                 head_scope: str = "others", mass: str = "seen", min_queries: int = 8, task: Any = "cloze",
                 task_items: Optional[int] = None, task_seed: int = 0, quick: bool = False,
                 progress: bool = True, batch_bytes: Optional[int] = None) -> BosControls:
    """Controls for ⟨bos⟩ removal (see the module docstring): every condition's perplexity on the
    same predicted tokens, its sinks and where they sit, and a harder task's accuracy.

    Args:
        model: a :class:`sinklab.Model` with a ⟨bos⟩ token.
        conditions: :class:`Condition` objects, or names (or group names, e.g. ``"random_heads"``)
            from :func:`default_conditions`, which is the default (``quick``: the
            :data:`QUICK_CONDITIONS`); the baseline ``"bos"`` always runs first (the sink heads
            come from it).
        texts: perplexity texts (strings or text ids); default the ``"heldout"`` passages.
        sink_prompts: sink prompts; default the ``"sinks"`` passages (those with >= T tokens).
        n_texts, n_sink: use the first n of them (default all; ``quick``: 8 and 8).
        max_tokens: text tokens per perplexity text (default 200; ``quick``: 96).
        T: tokens per sink sequence, the head included (64).
        eps: sink threshold (0.3) for sink rates and sink heads.
        draws: random draws of each random-heads control (default 5; ``quick``: 2).
        seed: seed of the random head draws.
        head_scope: zero_first_value scope of the sink-head / random-head controls (``"others"``).
        mass, min_queries: how the top key of a head is found (:func:`locate`): ``"seen"``
            (Gu's a_k, default) or ``"all"`` (m_k), among keys seen by >= ``min_queries`` queries.
        task: ``"cloze"`` (:mod:`sinklab.analysis.tasks` cloze items on the perplexity texts,
            scored from the perplexity forward), None (no task), a list of forced-choice items
            (objects with ``context`` or ``ids``, ``candidates``, ``target``, or
            (context, candidates, target) tuples: correct when the true candidate's summed
            log-likelihood after head + context is strictly highest), or a callable
            ``task(model) -> items`` (e.g. ``lambda m: [p for p in ...multikey prompts]``).
        task_items: cloze items (default 400; ``quick``: 48); ``task_seed`` their seed.
        quick: small defaults for a fast run (:data:`QUICK`).
        progress: tqdm bars.
        batch_bytes: cap on one forward's capture buffers (:data:`sinklab.batching.BATCH_BYTES`).

    Returns:
        :class:`BosControls`.
    """
    t_start = time.perf_counter()
    d = QUICK if quick else FULL
    n_texts = d["n_texts"] if n_texts is None else n_texts
    max_tokens = d["max_tokens"] if max_tokens is None else int(max_tokens)
    n_sink = d["n_sink"] if n_sink is None else n_sink
    draws = d["draws"] if draws is None else int(draws)
    task_items = d["task_items"] if task_items is None else int(task_items)
    if mass not in MASSES:
        raise ValueError(f"mass must be one of {MASSES}, got {mass!r}")
    bos_id = model.bos_id(True)
    c = model.config
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")

    # ---- the conditions
    defaults = None
    conds: List[Condition] = []
    if conditions is None:
        conditions = default_conditions(model, draws, head_scope=head_scope)
        if quick:
            conditions = [cd for cd in conditions if cd.group_key in QUICK_CONDITIONS]
    for x in conditions:
        if isinstance(x, str):
            if defaults is None:
                defaults = {cd.name: cd for cd in default_conditions(model, max(draws, 1), head_scope=head_scope)}
            if x in defaults:
                conds.append(defaults[x])
            else:
                grp = [cd for cd in defaults.values() if cd.group == x]
                if not grp:
                    raise ValueError(f"unknown condition {x!r}; known: {sorted(defaults)}")
                conds.extend(grp[: max(draws, 1)])
        elif isinstance(x, Condition):
            conds.append(x)
        else:
            raise TypeError(f"a condition is a Condition or a name, got {x!r}")
    if not any(cd.kind == "bos" for cd in conds):
        conds.insert(0, Condition("bos", "bos", "⟨bos⟩ (baseline)"))
    names = [cd.name for cd in conds]
    if len(set(names)) != len(names):
        raise ValueError(f"condition names must be unique, got {names}")
    base = next(cd for cd in conds if cd.kind == "bos")
    conds = [base] + [cd for cd in conds if cd is not base]

    # ---- inputs (the same in every condition)
    xs, raw = _texts(model, texts, n_texts, max_tokens)
    longest_head = max(len(cd.head(bos_id)[0]) for cd in conds)
    if max(len(x) for x in xs) + longest_head > c.context_length:
        raise ValueError(f"texts of {max(len(x) for x in xs)} tokens plus {longest_head} head tokens exceed the "
                         f"context length {c.context_length}; lower max_tokens")
    sink_x = _sink_texts(model, sink_prompts, n_sink, T)
    skipped: Dict[str, str] = {}
    items: List[_Item] = []
    shared_task = False
    if task is not None:
        if isinstance(task, str):
            if task != "cloze":
                raise ValueError(f"task must be 'cloze', None, a list of items or a callable, got {task!r}")
            try:
                items, dropped = _cloze_items(model, raw, xs, task_items, task_seed)
                shared_task = True
                if dropped:
                    skipped["cloze items"] = f"{dropped} not prefixes of the cut texts or multi-token"
            except ImportError:
                skipped["task"] = "sinklab.analysis.tasks is not available"
        else:
            got = task(model) if callable(task) else task
            items = [_as_item(it) for it in got]
    by_text: Dict[int, List[Tuple[int, _Item]]] = {}
    if shared_task:
        for j, it in enumerate(items):
            by_text.setdefault(int(it.passage), []).append((j, it))

    # ---- run
    results: Dict[str, ConditionResult] = {}
    sink = np.zeros((c.n_layers, c.n_heads), bool)
    k = 0
    for cd in conds:
        if cd.kind == "value" and cd.scope == "mean" and not mean_scope_available():
            skipped[cd.name] = "zero_first_value_scope 'mean' is not available in this sinklab"
            continue
        if cd.kind == "value" and cd.heads in ("sink", "random", "sink_random"):
            n_s, n_n = int(sink.sum()), int((~sink).sum())
            if cd.heads == "sink" and n_s == 0:
                skipped[cd.name] = f"no sink heads (mean a_0 > {eps:g}) on the baseline"
                continue
            if cd.heads in ("random", "sink_random") and k == 0:
                skipped[cd.name] = "no sink heads or no non-sink heads to match"
                continue
            if cd.heads == "sink_random" and k == n_s:
                skipped[cd.group_key] = (f"k = {k} is every sink head: 'sink_heads' is the matched control")
                continue
        t0 = time.perf_counter()
        iv, heads = _intervention(cd, sink, k, seed)
        if heads is not None and cd.group and any(
                r.condition.group == cd.group and np.array_equal(r.heads, heads) for r in results.values()):
            skipped[cd.name] = f"the same {int(heads.sum())} heads as an earlier draw (the pool has only k heads)"
            continue
        head_ids, bos_pos = cd.head(bos_id)
        sums, counts, corr = _perplexity_and_cloze(model, xs, cd, bos_id, iv, by_text, batch_bytes, progress)
        seqs = [build_sequence(cd, x, bos_id, total=T)[0] for x in sink_x]
        loc = sink_location(model, seqs, text_pos=len(head_ids), bos_pos=bos_pos, eps=eps, mass=mass,
                            min_queries=min_queries, intervene=iv,
                            batch_bytes=batch_bytes, progress=progress, desc=f"sinks ({cd.name})")
        task_correct = None
        if items:
            if shared_task:
                task_correct = np.array([corr[j] for j in range(len(items))], bool)
            else:
                task_correct = _score_items(model, items, head_ids, iv, batch_bytes)
        results[cd.name] = ConditionResult(cd, sums, counts, loc, heads, task_correct, tuple(head_ids),
                                           time.perf_counter() - t0)
        if cd is base:
            sink = loc.head_a0 > eps
            k = min(int(sink.sum()), int((~sink).sum()))
    meta = {"model": model.name, "eps": float(eps), "T": int(T), "max_tokens": int(max_tokens),
            "n_texts": len(xs), "n_sink": len(sink_x), "draws": int(draws), "seed": int(seed),
            "head_scope": head_scope, "mass": mass, "min_queries": int(min_queries), "quick": bool(quick),
            "texts": "heldout passages" if texts is None else f"{len(xs)} user texts",
            "sink_prompts": "sinks passages" if sink_prompts is None else f"{len(sink_x)} user prompts",
            "task": (None if not items else ("cloze (tasks.make_cloze_items on the perplexity texts, "
                                             f"seed {task_seed}, {len(items)} items)" if shared_task
                                             else f"{len(items)} user items")),
            "skipped": skipped, "seconds": time.perf_counter() - t_start}
    return BosControls(results=results, sink_heads=sink, k_matched=int(k), meta=meta, baseline=base.name)


# ====================================================================== the reading
def criterion_bos_controls(result: BosControls) -> Dict[str, S.Verdict]:
    """Verdicts on the two readings of ⟨bos⟩ removal, H1 (an unfamiliar first token) and H2
    (the lost sink), from the controls. Written from the hypotheses, thresholds fixed above:

    ``controls_removal``
        The effect to explain: removing ⟨bos⟩ raises perplexity by at least x1.5
        (:data:`REMOVAL_PPL_RATIO`; :func:`status.threshold` on exp ΔNLL). Without it there is
        nothing to separate.
    ``controls_sink_tied``
        Replacing ⟨bos⟩ by other tokens loses the sink (the fixed-⟨bos⟩ prediction of Table 2):
        per replacement the sink rate at position 0 over the baseline's, paired over prompts;
        reproduced if every replacement's interval lies at or below :data:`KEEP_SINK_RATIO`,
        contradicted if some replacement's lies above it (a sink forms on that token), else
        inconclusive.
    ``controls_identity`` (the separating one)
        H1 and H2 disagree only where the first token changes but a sink is kept: H2 predicts
        most of removal's loss is avoided, H1 that it is not. Such controls: replacements and
        prefixes whose sink rate (at their ⟨bos⟩, else at position 0) is at least
        :data:`KEEP_SINK_RATIO` of the baseline's (interval). For each the share of removal's
        loss it keeps, r = ΔNLL(c) / ΔNLL(none), paired over texts. Reproduced (H2) if every
        such r lies below :data:`COST_RATIO`; contradicted (H1) if some r lies above it; else
        inconclusive; not testable if no control changes the first token and keeps the sink
        (then identity and sink are confounded in every control here).
    ``controls_noop``
        The no-op reading (§3.2): with the sink kept, zeroing what ⟨bos⟩ passes on (scope
        "others", all heads) costs little: :func:`status.equivalence` of ΔNLL within
        ±:data:`NOOP_MARGIN_NLL` nats. Contradicted (the interval lies beyond the margin) means
        the sink is not a pure no-op in aggregate. Not testable when the zeroing loses the sink
        (sink rate ratio below :data:`KEEP_SINK_RATIO`).
    ``controls_mean``
        The sink avoids mixing: replacing v_0 by the mean of the other values (scope "mean",
        all heads) costs more than zeroing it: ΔNLL(mean) − ΔNLL(zero_others) > 0
        (:func:`status.directional`); not testable when the mean scope did not run.
    ``controls_heads``
        The heads that park attention on ⟨bos⟩ are the ones that read its value: zeroing the
        sink heads' v_0 costs more than zeroing as many random non-sink heads': the paired
        difference in ΔNLL (count-matched, draws averaged) > 0 (:func:`status.directional`).
    """
    r = result
    out: Dict[str, S.Verdict] = {}
    have = set(r.groups())

    # ---- removal
    if "none" in have:
        ratio = r.dnll("none").map(math.exp)
        out["controls_removal"] = S.threshold(
            ratio, REMOVAL_PPL_RATIO, 1.0, "perplexity ratio without / with ⟨bos⟩", ".2f",
            criterion=f"reproduced if the 95% interval of exp ΔNLL(no ⟨bos⟩) lies at or above {REMOVAL_PPL_RATIO:g}, "
                      f"contradicted if wholly below, else inconclusive")
    else:
        out["controls_removal"] = S.not_testable("the 'none' condition was not run")

    # ---- replacements keep or lose the sink
    reps = [g for g, ms in r.groups().items() if r[ms[0]].condition.kind == "replace"]
    crit = (f"per replacement, the sink rate at position 0 over the baseline's (paired over prompts): reproduced "
            f"if every interval lies at or below {KEEP_SINK_RATIO:g}, contradicted if one lies above, else inconclusive")
    if not reps:
        out["controls_sink_tied"] = S.not_testable("no replacement of ⟨bos⟩ was run", crit)
    else:
        ivs = {g: r.sink_rate_ratio(g, "pos0") for g in reps}
        kept = [g for g, iv in ivs.items() if iv.defined and iv.lo > KEEP_SINK_RATIO]
        lost = [g for g, iv in ivs.items() if iv.defined and iv.hi <= KEEP_SINK_RATIO]
        worst = max(ivs, key=lambda g: ivs[g].value)
        if kept:
            st, why = S.CONTRADICTED, (f"a sink forms on the replacement: {', '.join(kept)} keep "
                                       f"{', '.join(ivs[g].fmt('.2f') for g in kept)} of the baseline's sink rate")
        elif len(lost) == len(reps):
            st, why = S.REPRODUCED, (f"every replacement ({len(reps)}) loses the sink: sink-rate ratio at most "
                                     f"{ivs[worst].fmt('.2f')} ({worst}), ≤ {KEEP_SINK_RATIO:g}")
        else:
            st, why = S.INCONCLUSIVE, (f"{len(reps) - len(lost)} replacement(s) straddle {KEEP_SINK_RATIO:g}, e.g. "
                                       f"{worst} {ivs[worst].fmt('.2f')}")
        out["controls_sink_tied"] = S.Verdict(st, why, crit, {g: iv for g, iv in ivs.items()})

    # ---- identity vs sink
    crit = (f"controls that change the first token but keep ≥ {KEEP_SINK_RATIO:g} of the sink rate: reproduced (the "
            f"sink, H2) if every one keeps < {COST_RATIO:g} of removal's ΔNLL (interval), contradicted (identity, H1) "
            f"if one keeps more, else inconclusive; not testable when no such control exists")
    cands = [g for g, ms in r.groups().items() if r[ms[0]].condition.kind in ("replace", "prefix")]
    if "none" not in have:
        out["controls_identity"] = S.not_testable("the 'none' condition was not run", crit)
    elif not cands:
        out["controls_identity"] = S.not_testable("no replacement or prefix condition was run", crit)
    elif not r.dnll("none").above(0):
        out["controls_identity"] = S.not_testable(f"removal costs nothing detectable (ΔNLL {r.dnll('none').fmt('+.3f')})"
                                                  f": no loss to attribute", crit)
    else:
        keep_ratio = {g: r.sink_rate_ratio(g) for g in cands}
        keepers = [g for g in cands if keep_ratio[g].defined and keep_ratio[g].lo >= KEEP_SINK_RATIO]
        if not keepers:
            best = max(cands, key=lambda g: keep_ratio[g].value)
            out["controls_identity"] = S.not_testable(
                f"every control that changes the first token also loses the sink (best {best}: sink-rate ratio "
                f"{keep_ratio[best].fmt('.2f')}), so identity and sink are confounded here", crit,
                {g: keep_ratio[g] for g in cands})
        else:
            share = {g: r.dnll_ratio(g, "none") for g in keepers}
            costly = [g for g in keepers if share[g].defined and share[g].lo > COST_RATIO]
            cheap = [g for g in keepers if share[g].defined and share[g].hi < COST_RATIO]
            desc = "; ".join(f"{g}: sink ratio {keep_ratio[g].fmt('.2f')}, share of removal's ΔNLL {share[g].fmt('.2f')}"
                             for g in keepers)
            if costly:
                st, why = S.CONTRADICTED, f"the first token's identity costs even with the sink kept ({desc})"
            elif len(cheap) == len(keepers):
                st, why = S.REPRODUCED, f"with the sink kept, a changed first token costs little ({desc})"
            else:
                st, why = S.INCONCLUSIVE, f"the share of removal's loss straddles {COST_RATIO:g} ({desc})"
            nums = {f"{g}_sink_ratio": keep_ratio[g] for g in keepers}
            nums.update({f"{g}_loss_share": share[g] for g in keepers})
            out["controls_identity"] = S.Verdict(st, why, crit, nums)

    # ---- the no-op reading
    crit = (f"reproduced if the 95% interval of ΔNLL(v(⟨bos⟩) = 0 for queries ≥ 1, all heads) lies within "
            f"±{NOOP_MARGIN_NLL:g} nats (an approximate no-op), contradicted if wholly outside, else inconclusive; not "
            f"testable if the zeroing loses the sink (sink-rate ratio < {KEEP_SINK_RATIO:g})")
    if "zero_others" not in have:
        out["controls_noop"] = S.not_testable("the 'zero_others' condition was not run", crit)
    else:
        kr = r.sink_rate_ratio("zero_others", "pos0")
        if kr.defined and kr.hi < KEEP_SINK_RATIO:
            out["controls_noop"] = S.not_testable(f"zeroing loses the sink (sink-rate ratio {kr.fmt('.2f')})", crit)
        else:
            v = S.equivalence(r.dnll("zero_others"), NOOP_MARGIN_NLL, "ΔNLL with ⟨bos⟩'s value zeroed (queries ≥ 1)",
                              "+.3f", crit)
            extra = f"; the sink stays (sink-rate ratio {kr.fmt('.2f')})"
            if v.status == S.CONTRADICTED:
                extra += ": the sink is not a pure no-op in aggregate"
            out["controls_noop"] = S.Verdict(v.status, v.reason + extra, crit, {**v.numbers, "sink_ratio": kr})

    # ---- mean vs zero
    crit = ("reproduced if the 95% interval of ΔNLL(v_0 = mean of the others) − ΔNLL(v_0 = 0) lies above 0 (mixing "
            "costs more than the no-op), contradicted if below, else inconclusive")
    if "mean_others" in have and "zero_others" in have:
        out["controls_mean"] = S.directional(r.dnll("mean_others", "zero_others"), +1,
                                             "ΔNLL(mean value) − ΔNLL(zeroed value)", criterion=crit)
    else:
        out["controls_mean"] = S.not_testable("the 'mean_others' or 'zero_others' condition was not run", crit)

    # ---- sink heads vs random heads
    crit = ("reproduced if the 95% interval of ΔNLL(sink heads' v_0 zeroed) − ΔNLL(as many random non-sink heads') "
            "lies above 0, contradicted if below, else inconclusive (paired over texts, draws averaged)")
    if "random_heads" in have and ("sink_random" in have or "sink_heads" in have):
        sink_side = "sink_random" if "sink_random" in have else "sink_heads"
        v = S.directional(r.heads_difference(sink_side), +1,
                          f"ΔNLL({sink_side}) − ΔNLL(random non-sink heads), k = {r.k_matched}", criterion=crit)
        m, sd, n = r.draw_spread("random_heads", "dnll")
        spread = (f"random heads' ΔNLL over {n} draws {m:+.3f} ± {sd:.3f}" if n > 1 else
                  f"random heads' ΔNLL {m:+.3f} (one distinct draw: k is every non-sink head)")
        out["controls_heads"] = S.Verdict(v.status, v.reason + "; " + spread, crit,
                                          {**v.numbers, "random_draws_mean": m, "random_draws_sd": sd})
    else:
        out["controls_heads"] = S.not_testable("the sink-head and random-head controls did not both run", crit)
    return out
