"""Tasks that are not at ceiling: multi-key retrieval and cloze, with and without ⟨bos⟩.

The passkey task (:mod:`sinklab.analysis.quality`) is answered perfectly by Gemma-3-270M with
and without ⟨bos⟩, so it separates nothing. The two tasks here are harder, report accuracies
with Wilson intervals, and keep per-item correctness so that two conditions run on the same
items (with / without ⟨bos⟩, with / without an intervention) can be compared pairwise
(:func:`compare`, a paired bootstrap through :func:`sinklab.analysis.stats.paired_difference`).

**Multi-key retrieval** (:func:`multikey_retrieval`). A haystack of filler text (the passkey
task's repeated sentences, or sentences of the shipped passages' ``"sinks"`` split) holds
``n_keys`` sentences "The pass code for <first> <last> is 48213." at random depths, each name
with its own 5-digit value. With ``near_duplicates`` (default) the other names share the first
or the last name of the asked one ("Alice Brown" / "Alice Green" / "Carol Brown"). The prompt
ends "What is the pass code for Alice Brown? The pass code for Alice Brown is" and the answer is
" 48213". The candidates are the ``n_keys`` values present in the prompt, so chance is
``1 / n_keys`` (the asked key is drawn uniformly, independently of values and depths, so any
preference of the model for a digit or a depth still averages to chance). Scoring (``score``):

* ``"first"`` (default; one forward per trial): the values have pairwise different leading
  digits, so all candidates share their first answer tokens (the space) and differ at one
  token position p; the score of candidate k is the log-likelihood of its first p+1 tokens,
  log P(shared prefix) + log P(token_k at p | prefix), i.e. which value the model starts to
  write. ``exact``: greedy decoding emits the whole asked value (forced decoding, the argmax at
  every answer position is the answer token: the same event, see ``quality.py``).
* ``"sum"`` (``n_keys`` forwards per trial): the summed log-likelihood of every candidate's
  whole answer; ``exact`` as above.

A trial is correct when the asked value scores strictly highest (a tie counts as wrong).

**Cloze** (:func:`cloze`). Items from held-out public-domain text (the shipped Austen passages'
``"heldout"`` split, 36 paragraphs that nothing else in sinklab is tuned on): a context of
``min_context``..``max_context`` tokens (a prefix of one passage, cut before a word), then the
true next word (its leading letters, with the space before it) against ``n_candidates - 1``
distractor words drawn from the same passage (by occurrence, so frequent words are frequent
distractors; distinct, never the true word in another case), of the same token count as the
true word where the passage has enough. Each candidate is scored by the model's summed
log-likelihood of its tokens after the context; chance is ``1 / n_candidates``. With
``max_word_tokens=1`` (default) every candidate is one token and one forward over a passage
scores all of its items at once, so 400 items cost 36 forwards of ~200 tokens.

Items sharing a passage are not fully independent; ``ClozeResult.accuracy()`` is the Wilson
interval over items and ``ClozeResult.clustered_accuracy()`` a bootstrap over passages (the
honest one when items per passage are many).

**BOS alignment.** The prompts and items do not depend on ``bos``: with ⟨bos⟩ the model reads
[BOS] + prompt (+ answer), without it the same tokens with nothing in front, exactly as in
``quality.py``. ``intervene`` is passed to every forward.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..batching import run_each
from ..inputs import check_length
from ..progress import progress_bar
from ..prompts import load_passages
from ..results import to_jsonable
from .quality import FILLER, log_sum_exp_rows
from .stats import Interval, paired_difference, weighted_mean_ci, wilson

RETRIEVAL_FORMAT = "sinklab.RetrievalResult/1"
CLOZE_FORMAT = "sinklab.ClozeResult/1"

MK_INTRO = ("Several pass codes are hidden inside a lot of irrelevant text. Each one belongs to a "
            "different person. Memorize all of them. I will ask you for one of them.")
MK_NEEDLE = "The pass code for {name} is {value}."
MK_QUESTION = "What is the pass code for {name}?"
MK_CUE = "The pass code for {name} is"
FIRST_NAMES = ("Alice", "Bruno", "Carol", "David", "Elena", "Frank", "Grace", "Henry", "Irene",
               "James", "Karen", "Louis", "Maria", "Nolan", "Olive", "Peter", "Rosa", "Simon",
               "Tina", "Victor", "Wendy", "Oscar", "Laura", "Hugo")
LAST_NAMES = ("Brown", "Green", "Walker", "Turner", "Parker", "Hughes", "Foster", "Murphy",
              "Bishop", "Porter", "Fisher", "Warren", "Harper", "Dixon", "Carter", "Mason",
              "Barker", "Reed", "Price", "Lowe")
FILLERS = ("repeat", "passages")
SCORES = ("first", "sum")
DEFAULT_LENGTHS = (256, 1024, 4096)
DEFAULT_TRIALS = 100
DEFAULT_KEYS = 6
DEFAULT_ITEMS = 400
DEFAULT_CANDIDATES = 6
_WORD = re.compile(r"\S+")
_CORE = re.compile(r"^[A-Za-z]+")


def _rng(seed: Any) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _log_softmax_at(logits: np.ndarray, cols: Sequence[Sequence[int]]) -> List[np.ndarray]:
    """For each row r of ``logits`` (R, V), log softmax(logits[r])[cols[r]] in float64 (the
    log-sum-exp of :func:`sinklab.analysis.quality.log_sum_exp_rows`)."""
    z = np.asarray(logits[: len(cols)])
    lse = log_sum_exp_rows(z)
    return [z[r, np.asarray(c, np.int64)].astype(np.float64) - lse[r] for r, c in enumerate(cols)]


def _intervention_name(intervene: Any) -> Optional[str]:
    if intervene is None:
        return None
    try:
        return repr(intervene)
    except Exception:  # pragma: no cover - a repr that fails
        return type(intervene).__name__


def _fmt_iv(iv: Interval) -> str:
    return f"{100 * iv.value:.1f}% [{100 * iv.lo:.1f}, {100 * iv.hi:.1f}]"


# ====================================================================== multi-key retrieval
@dataclass
class MultikeyPrompt:
    """One generated multi-key retrieval prompt.

    Attributes:
        ids: (n,) int64 prompt tokens without BOS, ending with the cue "... is".
        candidates: one (m_k,) int64 array per key: the answer tokens of its value after the cue.
        target: index of the asked key; ``answer = candidates[target]``.
        names, values: the keys' names and values (strings), in order of appearance.
        depths: each key's position as a fraction of the filler (sorted, in [0, 1]).
        length: requested tokens of [BOS slot] + prompt + answer; ``n_tokens`` the real count.
        n_filler: filler sentences used; ``text`` the prompt text.
    """

    ids: np.ndarray
    candidates: List[np.ndarray]
    target: int
    names: List[str]
    values: List[str]
    depths: List[float]
    length: int
    n_filler: int
    filler: str
    text: str

    @property
    def answer(self) -> np.ndarray:
        return self.candidates[self.target]

    @property
    def n_tokens(self) -> int:
        return 1 + len(self.ids) + len(self.answer)

    def sequence(self, bos_id: Optional[int], k: Optional[int] = None) -> np.ndarray:
        """(T,) int64: [BOS] + prompt + candidate ``k`` (default the answer)."""
        cand = self.candidates[self.target if k is None else k]
        parts = ([[bos_id]] if bos_id is not None else []) + [self.ids, cand]
        return np.concatenate(parts).astype(np.int64)


def _names(rng: np.random.Generator, n_keys: int, near_duplicates: bool) -> Tuple[List[str], int]:
    """``n_keys`` distinct "First Last" names and the index of the asked one (uniform)."""
    firsts = list(rng.permutation(len(FIRST_NAMES)))
    lasts = list(rng.permutation(len(LAST_NAMES)))
    f0, l0 = FIRST_NAMES[firsts.pop()], LAST_NAMES[lasts.pop()]
    names = [f"{f0} {l0}"]
    if near_duplicates:
        # half the others share the asked first name, half its last name
        for j in range(1, n_keys):
            if j % 2 == 1:
                names.append(f"{f0} {LAST_NAMES[lasts.pop()]}")
            else:
                names.append(f"{FIRST_NAMES[firsts.pop()]} {l0}")
    else:
        for _ in range(1, n_keys):
            names.append(f"{FIRST_NAMES[firsts.pop()]} {LAST_NAMES[lasts.pop()]}")
    order = list(rng.permutation(n_keys))
    names = [names[i] for i in order]
    return names, order.index(0)


def _values(rng: np.random.Generator, n_keys: int) -> List[str]:
    """``n_keys`` 5-digit values with pairwise different leading digits (so n_keys <= 9)."""
    lead = rng.choice(np.arange(1, 10), size=n_keys, replace=False)
    return [str(int(d) * 10000 + int(rng.integers(0, 10000))) for d in lead]


def _logits(tr: Any) -> np.ndarray:
    """The logits a run_each trace was asked for (they are always captured here)."""
    if tr.logits is None:
        raise RuntimeError("internal: a task forward returned no logits")
    return tr.logits


def _filler_sentences(filler: str, rng: np.random.Generator, n: int) -> List[str]:
    if filler == "repeat":
        return [FILLER[j % len(FILLER)] for j in range(n)]
    sents: List[str] = []
    for p in load_passages("sinks"):
        sents.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", p) if s.strip())
    start = int(rng.integers(0, len(sents)))
    return [sents[(start + j) % len(sents)] for j in range(n)]


def _check_keys(n_keys: int, score: str) -> int:
    if isinstance(n_keys, bool) or not isinstance(n_keys, (int, np.integer)):
        raise ValueError(f"n_keys must be an integer, got {n_keys!r}")
    n_keys = int(n_keys)
    if n_keys < 2:
        raise ValueError(f"n_keys must be >= 2 (one asked key and at least one distractor), got {n_keys}")
    if n_keys > 9:
        raise ValueError(f"n_keys must be <= 9 (the values need different leading digits), got {n_keys}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    return n_keys


def make_multikey_prompt(model, length: int, n_keys: int = DEFAULT_KEYS,
                         seed: Union[int, Sequence[int], np.random.Generator] = 0,
                         near_duplicates: bool = True, filler: str = "repeat") -> MultikeyPrompt:
    """A multi-key retrieval prompt whose [BOS slot] + prompt + answer has at most ``length``
    tokens (and at least ``length`` minus one filler sentence).

    Args:
        model: a :class:`sinklab.Model` (its tokenizer).
        length: target token count (BOS slot included, as in ``quality.make_passkey_prompt``).
        n_keys: key-value sentences in the haystack (2..9), one of them asked.
        seed: an int, a sequence of ints or a Generator: names, values, depths and the asked key.
        near_duplicates: the other names share the asked name's first or last name.
        filler: ``"repeat"`` (the passkey task's sentences) or ``"passages"`` (sentences of the
            shipped passages' ``"sinks"`` split, from a random start).

    Raises:
        ValueError: ``n_keys`` outside 2..9, an unknown filler, ``length`` above the context or
            too short to hold the keys.
    """
    n_keys = _check_keys(n_keys, "first")
    if filler not in FILLERS:
        raise ValueError(f"filler must be one of {FILLERS}, got {filler!r}")
    length = int(length)
    check_length(model, length, "multi-key retrieval length")
    rng = _rng(seed)
    names, target = _names(rng, n_keys, near_duplicates)
    values = _values(rng, n_keys)
    depths = sorted(float(d) for d in rng.uniform(size=n_keys))
    pool = _filler_sentences(filler, rng, max(64, 2 * length))
    asked = names[target]

    def text_of(n: int) -> str:
        sents = list(pool[:n])
        # insert from the last so that earlier indices stay valid; ties keep key order
        for k in range(n_keys - 1, -1, -1):
            sents.insert(int(round(depths[k] * n)), MK_NEEDLE.format(name=names[k], value=values[k]))
        body = " ".join([MK_INTRO] + sents + [MK_QUESTION.format(name=asked)])
        return f"{body} {MK_CUE.format(name=asked)}"

    def encode(n: int, only: Optional[int] = None) -> Tuple[np.ndarray, List[np.ndarray], str]:
        text = text_of(n)
        prompt = np.asarray(model.tokenize(text, bos=False), np.int64)
        cands = []
        for v in (values if only is None else [values[only]]):
            full = np.asarray(model.tokenize(text + " " + v, bos=False), np.int64)
            if len(full) <= len(prompt) or not np.array_equal(full[: len(prompt)], prompt):
                raise RuntimeError("the tokenizer merges the value into the cue; retrieval needs them apart")
            cands.append(full[len(prompt):])
        return prompt, cands, text

    def size(n: int) -> int:
        p, c, _ = encode(n, only=target)
        return 1 + len(p) + len(c[0])

    base = size(0)
    if base > length:
        raise ValueError(f"multi-key retrieval length {length} is too short for n_keys={n_keys}: the "
                         f"prompt without filler already has {base} tokens")
    probe = min(50, len(pool))
    per = max((size(probe) - base) / probe, 1.0)
    n = min(len(pool), max(0, int((length - base) / per)))
    while n > 0 and size(n) > length:
        n = max(0, n - max(1, int((size(n) - length) / per)))
    while n + 1 <= len(pool) and size(n + 1) <= length:
        n += 1
    p, c, text = encode(n)
    return MultikeyPrompt(ids=p, candidates=c, target=target, names=names, values=values,
                          depths=depths, length=length, n_filler=n, filler=filler, text=text)


def _divergence(cands: List[np.ndarray]) -> int:
    """The first token position at which the candidates differ; they must differ pairwise there."""
    p = 0
    while all(len(c) > p for c in cands) and len({int(c[p]) for c in cands}) == 1:
        p += 1
    if not all(len(c) > p for c in cands) or len({int(c[p]) for c in cands}) != len(cands):
        raise RuntimeError("the candidate values do not differ pairwise at one token position; "
                           "use score='sum'")
    return p


@dataclass
class RetrievalResult:
    """Multi-key retrieval for one condition; one entry per trial in every array (flat over
    lengths, in order: all trials of ``lengths[0]``, then ``lengths[1]``, ...).

    Attributes:
        length: (N,) requested length of each trial; ``n_tokens``: (N,) tokens the model read
            (one fewer without BOS).
        correct: (N,) bool, the asked value scored strictly highest among the ``n_keys`` values.
        exact: (N,) bool, greedy decoding writes the whole asked value.
        target, chosen: (N,) the asked key's index and the best-scoring key's index.
        scores: (N, n_keys) float64 candidate log-likelihoods (see the module docstring).
        margin: (N,) score of the asked value minus the best other (> 0: correct).
        target_depth: (N,) depth of the asked key in [0, 1].
        names, values: per trial the keys' names and values (to check that two results hold
            the same items).
        seconds: {length: wall seconds}.
        bos, bos_token_id, n_keys, near_duplicates, filler, score, seed, model, intervention.
    """

    length: np.ndarray
    n_tokens: np.ndarray
    correct: np.ndarray
    exact: np.ndarray
    target: np.ndarray
    chosen: np.ndarray
    scores: np.ndarray
    margin: np.ndarray
    target_depth: np.ndarray
    names: List[List[str]]
    values: List[List[str]]
    seconds: Dict[int, float]
    bos: bool
    bos_token_id: Optional[int]
    n_keys: int
    near_duplicates: bool
    filler: str
    score: str
    seed: int
    model: str
    intervention: Optional[str] = None

    @property
    def lengths(self) -> List[int]:
        return sorted({int(n) for n in self.length})

    @property
    def chance(self) -> float:
        return 1.0 / self.n_keys

    def _mask(self, length: Optional[int]) -> np.ndarray:
        if length is None:
            return np.ones(len(self.length), bool)
        m = self.length == int(length)
        if not m.any():
            raise ValueError(f"no trials at length {length}; lengths are {self.lengths}")
        return m

    def correct_at(self, length: Optional[int] = None, exact: bool = False) -> np.ndarray:
        """(n,) bool per-trial outcome at ``length`` (None: all lengths)."""
        return (self.exact if exact else self.correct)[self._mask(length)]

    def accuracy(self, length: Optional[int] = None, exact: bool = False) -> Interval:
        """Wilson interval of the multiple-choice (or, ``exact``, greedy) accuracy at ``length``."""
        c = self.correct_at(length, exact)
        return wilson(int(c.sum()), len(c))

    def exact_accuracy(self, length: Optional[int] = None) -> Interval:
        return self.accuracy(length, exact=True)

    def table(self) -> str:
        """Markdown: accuracy per length with its interval."""
        lines = [f"| length | trials | accuracy (chance {100 * self.chance:.0f}%) | exact (greedy) | s |",
                 "|---|---|---|---|---|"]
        for n in self.lengths:
            lines.append(f"| {n} | {int((self.length == n).sum())} | {_fmt_iv(self.accuracy(n))} "
                         f"| {_fmt_iv(self.exact_accuracy(n))} | {self.seconds.get(n, float('nan')):.1f} |")
        return "\n".join(lines)

    def __repr__(self) -> str:
        cond = "BOS" if self.bos else "no BOS"
        parts = [f"{n}: {100 * self.accuracy(n).value:.0f}% ±{100 * self.accuracy(n).half_width:.0f} "
                 f"(n={int((self.length == n).sum())})" for n in self.lengths]
        iv = f", {self.intervention}" if self.intervention else ""
        return (f"RetrievalResult({self.model}, {cond}{iv}, {self.n_keys} keys, score={self.score}, "
                f"chance {100 * self.chance:.0f}%; " + "; ".join(parts) + ")")

    def to_dict(self) -> Dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["seconds"] = {str(n): v for n, v in self.seconds.items()}
        d["format"] = RETRIEVAL_FORMAT
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "RetrievalResult":
        d = {k: v for k, v in d.items() if k != "format"}
        for k in ("length", "n_tokens", "target", "chosen"):
            d[k] = np.asarray(d[k], np.int64)
        for k in ("correct", "exact"):
            d[k] = np.asarray(d[k], bool)
        for k in ("margin", "target_depth"):
            d[k] = np.asarray([np.nan if v is None else v for v in d[k]], np.float64)
        d["scores"] = np.asarray([[np.nan if v is None else v for v in row] for row in d["scores"]],
                                 np.float64).reshape(len(d["length"]), -1)
        d["seconds"] = {int(n): float(v) for n, v in d["seconds"].items()}
        return cls(**d)

    def same_items(self, other: "RetrievalResult") -> bool:
        return (np.array_equal(self.length, other.length) and self.names == other.names
                and self.values == other.values and np.array_equal(self.target, other.target))


def _score_retrieval(model, prompts: List[MultikeyPrompt], bos_id: Optional[int], score: str,
                     intervene: Any, batch_bytes: Optional[int], bar: Any):
    """(scores (N, K), exact (N,)) for every prompt."""
    K = len(prompts[0].candidates)
    scores = np.full((len(prompts), K), np.nan)
    exact = np.zeros(len(prompts), bool)
    off = 0 if bos_id is None else 1
    if score == "first":
        divs = [_divergence(p.candidates) for p in prompts]
        seqs = [p.sequence(bos_id) for p in prompts]
        starts = [off + len(p.ids) - 1 for p in prompts]     # row predicting the first answer token
        at = [s0 + np.arange(len(p.answer)) for s0, p in zip(starts, prompts)]
        for i, tr in run_each(model, seqs, ("logits",), logits_at=at, intervene=intervene,
                              batch_bytes=batch_bytes, progress=False, ragged=True):
            p, q = prompts[i], divs[i]
            ans = p.answer
            rows = _logits(tr)
            exact[i] = bool(np.array_equal(rows.argmax(axis=-1), ans))
            cols = [[int(ans[j])] for j in range(q)] + [[int(c[q]) for c in p.candidates]]
            lp = _log_softmax_at(rows[: q + 1], cols)
            shared = float(sum(v[0] for v in lp[:q]))
            scores[i] = shared + lp[q]
            bar.update(1)
        return scores, exact
    seqs, owner = [], []
    for i, p in enumerate(prompts):
        for k in range(K):
            seqs.append(p.sequence(bos_id, k))
            owner.append((i, k))
    at = [off + len(prompts[i].ids) - 1 + np.arange(len(prompts[i].candidates[k])) for i, k in owner]
    done = np.zeros(len(prompts), np.int64)
    for j, tr in run_each(model, seqs, ("logits",), logits_at=at, intervene=intervene,
                          batch_bytes=batch_bytes, progress=False, ragged=True):
        i, k = owner[j]
        p = prompts[i]
        cand = p.candidates[k]
        rows = _logits(tr)
        lp = _log_softmax_at(rows, [[int(t)] for t in cand])
        scores[i, k] = float(sum(v[0] for v in lp))
        if k == p.target:
            exact[i] = bool(np.array_equal(rows.argmax(axis=-1), cand))
        done[i] += 1
        if done[i] == K:
            bar.update(1)
    return scores, exact


def _outcome(scores: np.ndarray, target: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(correct, chosen, margin): target strictly best; argmax; target minus the best other."""
    n = len(target)
    t = scores[np.arange(n), target]
    others = scores.copy()
    others[np.arange(n), target] = -np.inf
    best_other = others.max(axis=1)
    return t > best_other, scores.argmax(axis=1), t - best_other


def multikey_retrieval(model, lengths: Sequence[int] = DEFAULT_LENGTHS, trials: int = DEFAULT_TRIALS,
                       n_keys: int = DEFAULT_KEYS, bos: bool = True, seed: int = 0, intervene=None,
                       progress: bool = True, score: str = "first", near_duplicates: bool = True,
                       filler: str = "repeat", batch_bytes: Optional[int] = None) -> RetrievalResult:
    """Multi-key retrieval accuracy per length (see the module docstring).

    Args:
        model: a :class:`sinklab.Model`.
        lengths: target lengths in tokens ([BOS slot] + prompt + answer), each <= the context.
        trials: prompts per length; trial ``t`` at length ``n`` is drawn from
            ``default_rng([seed, n, t])``, whatever ``bos`` and ``intervene``.
        n_keys: key-value pairs in every prompt (2..9); chance is 1 / n_keys.
        bos: prepend the model's BOS (the prompts are the same either way).
        seed: the prompts' seed.
        intervene: an optional :class:`sinklab.Intervention` applied in every forward.
        progress: tqdm bar over trials.
        score: ``"first"`` (one forward per trial) or ``"sum"`` (n_keys forwards per trial).
        near_duplicates: distractor names share the asked name's first or last name.
        filler: ``"repeat"`` or ``"passages"`` (see :func:`make_multikey_prompt`).
        batch_bytes: cap on one batched forward's logits (:data:`sinklab.batching.BATCH_BYTES`).

    Returns:
        :class:`RetrievalResult`.

    Time: one forward of ``length`` tokens per trial (``"first"``): Gemma-3-270M on 2 shared
    cores took 1.4-1.6 s a trial at 256 tokens and 6.6-7 s at 1024 (measured; 4096 is ~4x
    1024 or more).
    """
    n_keys = _check_keys(n_keys, score)
    if filler not in FILLERS:
        raise ValueError(f"filler must be one of {FILLERS}, got {filler!r}")
    lengths = tuple(int(n) for n in lengths)
    if not lengths:
        raise ValueError("lengths is empty")
    if len(set(lengths)) != len(lengths):
        raise ValueError(f"lengths has repeats: {lengths}")
    for n in lengths:
        check_length(model, n, "multi-key retrieval length")
    if isinstance(trials, bool) or int(trials) < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    trials = int(trials)
    bos_id = model.bos_id(bos)
    bar = progress_bar(None, progress, desc=f"multi-key retrieval ({'BOS' if bos else 'no BOS'})",
                       total=len(lengths) * trials, unit="trial")
    cols: Dict[str, list] = {k: [] for k in ("length", "n_tokens", "target", "scores", "exact",
                                             "target_depth", "names", "values")}
    secs = {}
    try:
        for n in lengths:
            t0 = time.perf_counter()
            prompts = [make_multikey_prompt(model, n, n_keys, seed=[int(seed), n, t],
                                            near_duplicates=near_duplicates, filler=filler)
                       for t in range(trials)]
            sc, ex = _score_retrieval(model, prompts, bos_id, score, intervene, batch_bytes, bar)
            secs[n] = time.perf_counter() - t0
            cols["length"] += [n] * trials
            cols["n_tokens"] += [p.n_tokens - (0 if bos else 1) for p in prompts]
            cols["target"] += [p.target for p in prompts]
            cols["scores"].append(sc)
            cols["exact"].append(ex)
            cols["target_depth"] += [p.depths[p.target] for p in prompts]
            cols["names"] += [list(p.names) for p in prompts]
            cols["values"] += [list(p.values) for p in prompts]
    finally:
        bar.close()
    scores = np.concatenate(cols["scores"])
    target = np.asarray(cols["target"], np.int64)
    correct, chosen, margin = _outcome(scores, target)
    return RetrievalResult(length=np.asarray(cols["length"], np.int64),
                           n_tokens=np.asarray(cols["n_tokens"], np.int64), correct=correct,
                           exact=np.concatenate(cols["exact"]), target=target, chosen=chosen,
                           scores=scores, margin=margin,
                           target_depth=np.asarray(cols["target_depth"], np.float64),
                           names=cols["names"], values=cols["values"], seconds=secs, bos=bool(bos),
                           bos_token_id=bos_id, n_keys=n_keys, near_duplicates=bool(near_duplicates),
                           filler=filler, score=score, seed=int(seed), model=model.name,
                           intervention=_intervention_name(intervene))


# ====================================================================== cloze
@dataclass
class ClozeItem:
    """One cloze item.

    Attributes:
        passage: index of the passage in its split; ``cut``: context tokens (a prefix of the
            passage's tokens, ``ids[:cut]``).
        context: (cut,) int64 context tokens (no BOS).
        candidates: one (m_k,) int64 array per candidate word (its tokens after the context).
        words: the candidate words (with their leading space); ``target`` the true one's index.
    """

    passage: int
    cut: int
    context: np.ndarray
    candidates: List[np.ndarray]
    words: List[str]
    target: int

    def sequence(self, bos_id: Optional[int], k: Optional[int] = None) -> np.ndarray:
        cand = self.candidates[self.target if k is None else k]
        parts = ([[bos_id]] if bos_id is not None else []) + [self.context, cand]
        return np.concatenate(parts).astype(np.int64)


def _cand_ids(model, ctx_text: str, ctx: np.ndarray, word: str) -> Optional[np.ndarray]:
    full = np.asarray(model.tokenize(ctx_text + word, bos=False), np.int64)
    if len(full) <= len(ctx) or not np.array_equal(full[: len(ctx)], ctx):
        return None
    return full[len(ctx):]


def make_cloze_items(model, n_items: int = DEFAULT_ITEMS, n_candidates: int = DEFAULT_CANDIDATES,
                     seed: int = 0, texts: Optional[Sequence[str]] = None, split: str = "heldout",
                     min_context: int = 64, max_context: int = 200,
                     max_word_tokens: Optional[int] = 1) -> List[ClozeItem]:
    """``n_items`` cloze items spread evenly over the passages (round robin, passage by passage
    in random order of cut positions), deterministic in ``seed``.

    Args:
        model: a :class:`sinklab.Model` (its tokenizer).
        n_items: items to make.
        n_candidates: the true word and ``n_candidates - 1`` distractors (>= 2).
        seed: fixes the cut positions and distractors.
        texts: passages to use (default :func:`sinklab.prompts.load_passages` of ``split``).
        split: the shipped passages' split when ``texts`` is None (default ``"heldout"``).
        min_context, max_context: context tokens (no BOS) of every item.
        max_word_tokens: the most tokens of the true word (distractors of the same count);
            1 (default) makes every candidate one token and the scoring one forward per passage;
            None: any.

    Raises:
        ValueError: bad sizes, or fewer eligible positions in the texts than ``n_items``.
    """
    if isinstance(n_items, bool) or int(n_items) < 1:
        raise ValueError(f"n_items must be >= 1, got {n_items}")
    if isinstance(n_candidates, bool) or int(n_candidates) < 2:
        raise ValueError(f"n_candidates must be >= 2 (the true word and a distractor), got {n_candidates}")
    if int(min_context) < 1 or int(max_context) < int(min_context):
        raise ValueError(f"need 1 <= min_context <= max_context, got {min_context}, {max_context}")
    if max_word_tokens is not None and int(max_word_tokens) < 1:
        raise ValueError(f"max_word_tokens must be >= 1 or None, got {max_word_tokens}")
    n_items, K = int(n_items), int(n_candidates)
    texts = list(load_passages(split) if texts is None else texts)
    if not texts:
        raise ValueError("texts is empty")
    check_length(model, int(max_context) + 1 + 8, "cloze context (max_context + BOS + word)")

    # per passage: a lazy generator of eligible items in a seeded random order of word positions
    def gen(pi: int):
        text = texts[pi]
        rng = np.random.default_rng([int(seed), pi])
        ids = np.asarray(model.tokenize(text, bos=False), np.int64)
        spans = [(m.start(), _CORE.match(m.group())) for m in _WORD.finditer(text)]
        cores = [c.group() for _, c in spans if c]
        for j in rng.permutation(len(spans)):
            s, core = spans[j]
            if core is None or s == 0 or text[s - 1] != " ":
                continue
            ctx_text = text[:s - 1]
            ctx = np.asarray(model.tokenize(ctx_text, bos=False), np.int64)
            if not (int(min_context) <= len(ctx) <= int(max_context)):
                continue
            if not np.array_equal(ids[: len(ctx)], ctx):
                continue
            word = " " + core.group()
            true = _cand_ids(model, ctx_text, ctx, word)
            if true is None or (max_word_tokens is not None and len(true) > int(max_word_tokens)):
                continue
            if not np.array_equal(ids[len(ctx): len(ctx) + len(true)], true):
                continue        # the word merges with what follows it in the passage ("Mr" + ".")
            # distractors: by occurrence in the passage, distinct, never the true word in any case
            seen = {core.group().lower()}
            same, other = [], []
            for d in rng.permutation(len(cores)):
                w = cores[d]
                if w.lower() in seen:
                    continue
                seen.add(w.lower())
                c = _cand_ids(model, ctx_text, ctx, " " + w)
                if c is None:
                    continue
                if len(c) == len(true):
                    same.append((" " + w, c))
                    if len(same) == K - 1:
                        break
                elif max_word_tokens is None:
                    other.append((" " + w, c))
            pool = same + sorted(other, key=lambda x: abs(len(x[1]) - len(true)))
            if len(pool) < K - 1:
                continue
            chosen = pool[: K - 1]
            t = int(rng.integers(0, K))
            cands = [c for _, c in chosen]
            words = [w for w, _ in chosen]
            cands.insert(t, true)
            words.insert(t, word)
            yield ClozeItem(passage=pi, cut=len(ctx), context=ctx, candidates=cands, words=words, target=t)

    gens = {pi: gen(pi) for pi in range(len(texts))}
    items: List[ClozeItem] = []
    while len(items) < n_items and gens:
        for pi in list(gens):
            if len(items) >= n_items:
                break
            it = next(gens[pi], None)
            if it is None:
                del gens[pi]
            else:
                items.append(it)
    if len(items) < n_items:
        raise ValueError(f"the texts hold only {len(items)} eligible cloze positions (context "
                         f"{min_context}-{max_context} tokens, {K} candidates, max_word_tokens="
                         f"{max_word_tokens}); asked for n_items={n_items}")
    items.sort(key=lambda it: (it.passage, it.cut))
    return items


@dataclass
class ClozeResult:
    """Cloze accuracy for one condition; one entry per item in every array.

    Attributes:
        correct: (N,) bool, the true word scored strictly highest.
        target, chosen: (N,) the true word's index and the best-scoring candidate's.
        scores: (N, K) float64 summed log-likelihood (nats) of each candidate after the context.
        margin: (N,) true word's score minus the best other's.
        passage, context_tokens: (N,) each item's passage index and context length (no BOS).
        words: per item the K candidate words.
        seconds: wall time.
        bos, bos_token_id, n_candidates, split, seed, min_context, max_context,
        max_word_tokens, model, intervention: the setting.
    """

    correct: np.ndarray
    target: np.ndarray
    chosen: np.ndarray
    scores: np.ndarray
    margin: np.ndarray
    passage: np.ndarray
    context_tokens: np.ndarray
    words: List[List[str]]
    seconds: float
    bos: bool
    bos_token_id: Optional[int]
    n_candidates: int
    split: str
    seed: int
    min_context: int
    max_context: int
    max_word_tokens: Optional[int]
    model: str
    intervention: Optional[str] = None

    @property
    def chance(self) -> float:
        return 1.0 / self.n_candidates

    @property
    def n_items(self) -> int:
        return len(self.correct)

    def correct_at(self, length: Optional[int] = None, exact: bool = False) -> np.ndarray:
        """(N,) bool per-item outcome (``length``/``exact`` accepted for symmetry; must be None/False)."""
        if length is not None or exact:
            raise ValueError("a cloze result has no lengths and no exact-match outcome")
        return self.correct

    def accuracy(self) -> Interval:
        """Wilson interval of the accuracy over items."""
        return wilson(int(self.correct.sum()), self.n_items)

    def clustered_accuracy(self, seed: Optional[int] = None) -> Interval:
        """Percentile bootstrap of the accuracy resampling whole passages (items of one passage
        share its text, so they are not independent draws)."""
        ps = np.unique(self.passage)
        groups = [np.flatnonzero(self.passage == p) for p in ps]
        k = np.asarray([self.correct[g].sum() for g in groups], np.float64)
        n = np.asarray([len(g) for g in groups], np.float64)
        return weighted_mean_ci(k, n, seed=seed)

    def __repr__(self) -> str:
        a = self.accuracy()
        cond = "BOS" if self.bos else "no BOS"
        iv = f", {self.intervention}" if self.intervention else ""
        return (f"ClozeResult({self.model}, {cond}{iv}, {self.n_items} items, {self.n_candidates} "
                f"candidates (chance {100 * self.chance:.0f}%): {100 * a.value:.1f}% "
                f"[{100 * a.lo:.1f}, {100 * a.hi:.1f}], {self.seconds:.1f} s)")

    def to_dict(self) -> Dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["format"] = CLOZE_FORMAT
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ClozeResult":
        d = {k: v for k, v in d.items() if k != "format"}
        for k in ("target", "chosen", "passage", "context_tokens"):
            d[k] = np.asarray(d[k], np.int64)
        d["correct"] = np.asarray(d["correct"], bool)
        d["margin"] = np.asarray([np.nan if v is None else v for v in d["margin"]], np.float64)
        d["scores"] = np.asarray([[np.nan if v is None else v for v in row] for row in d["scores"]],
                                 np.float64).reshape(len(d["correct"]), -1)
        return cls(**d)

    def same_items(self, other: "ClozeResult") -> bool:
        return (self.words == other.words and np.array_equal(self.passage, other.passage)
                and np.array_equal(self.context_tokens, other.context_tokens)
                and np.array_equal(self.target, other.target))


def _score_cloze(model, items: List[ClozeItem], bos_id: Optional[int], intervene: Any,
                 batch_bytes: Optional[int], progress: bool, desc: str) -> np.ndarray:
    """(N, K) summed log-likelihoods. One forward per passage (its tokens up to the last item's
    true word) gives every item's true word and every one-token candidate; candidates of more
    tokens get their own forward of [BOS] + context + candidate."""
    off = 0 if bos_id is None else 1
    K = len(items[0].candidates)
    scores = np.full((len(items), K), np.nan)
    by_passage: Dict[int, List[int]] = {}
    for i, it in enumerate(items):
        by_passage.setdefault(it.passage, []).append(i)
    base, base_at = [], []
    for p, idx in by_passage.items():
        end = max(items[i].cut + len(items[i].candidates[items[i].target]) for i in idx)
        longest = max(idx, key=lambda i: items[i].cut + len(items[i].candidates[items[i].target]))
        # the passage's tokens up to `end`: the longest item's context + true word
        seq = items[longest].sequence(bos_id)[: off + end]
        base.append((p, idx, seq))
        # the rows read: each item's, from the one predicting its word's first token
        base_at.append(np.unique(np.concatenate([off + items[i].cut - 1 + np.arange(len(items[i].candidates[items[i].target]))
                                                 for i in idx])))
    extra = [(i, k) for i, it in enumerate(items) for k, c in enumerate(it.candidates)
             if k != it.target and len(c) > 1]
    bar = progress_bar(None, progress, desc=desc, total=len(base) + len(extra), unit="forward")
    try:
        for b, tr in run_each(model, [s for _, _, s in base], ("logits",), logits_at=base_at,
                              intervene=intervene, batch_bytes=batch_bytes, progress=False, ragged=True):
            _, idx, seq = base[b]
            for i in idx:
                it = items[i]
                r0 = int(np.searchsorted(base_at[b], off + it.cut - 1))   # its rows are consecutive in base_at
                true = it.candidates[it.target]
                if not np.array_equal(seq[off + it.cut: off + it.cut + len(true)], true):
                    raise RuntimeError(f"cloze item {i}: its word is not the passage's next tokens")
                lp = _log_softmax_at(_logits(tr)[r0: r0 + len(true)],
                                     [[int(true[0])] + [int(c[0]) for k, c in enumerate(it.candidates)
                                                        if k != it.target and len(c) == 1]]
                                     + [[int(t)] for t in true[1:]])
                scores[i, it.target] = float(lp[0][0] + sum(v[0] for v in lp[1:]))
                singles = [k for k, c in enumerate(it.candidates) if k != it.target and len(c) == 1]
                for j, k in enumerate(singles):
                    scores[i, k] = float(lp[0][1 + j])
            bar.update(1)
        if extra:
            seqs = [items[i].sequence(bos_id, k) for i, k in extra]
            at = [off + items[i].cut - 1 + np.arange(len(items[i].candidates[k])) for i, k in extra]
            for j, tr in run_each(model, seqs, ("logits",), logits_at=at, intervene=intervene,
                                  batch_bytes=batch_bytes, progress=False, ragged=True):
                i, k = extra[j]
                cand = items[i].candidates[k]
                lp = _log_softmax_at(_logits(tr), [[int(t)] for t in cand])
                scores[i, k] = float(sum(v[0] for v in lp))
                bar.update(1)
    finally:
        bar.close()
    return scores


def cloze(model, n_items: int = DEFAULT_ITEMS, bos: bool = True, seed: int = 0, intervene=None,
          progress: bool = True, n_candidates: int = DEFAULT_CANDIDATES,
          texts: Optional[Sequence[str]] = None, split: str = "heldout", min_context: int = 64,
          max_context: int = 200, max_word_tokens: Optional[int] = 1,
          batch_bytes: Optional[int] = None) -> ClozeResult:
    """Cloze accuracy on held-out public-domain text (see the module docstring).

    Args:
        model: a :class:`sinklab.Model`.
        n_items: items (400 gives a Wilson half-width <= 4.9 points).
        bos: prepend the model's BOS (the items are the same either way).
        seed: fixes the items (:func:`make_cloze_items`).
        intervene: an optional :class:`sinklab.Intervention` applied in every forward.
        progress: tqdm bar over forwards.
        n_candidates: the true word and n_candidates - 1 distractors; chance 1 / n_candidates.
        texts, split, min_context, max_context, max_word_tokens: see :func:`make_cloze_items`.
        batch_bytes: cap on one batched forward's logits.

    Returns:
        :class:`ClozeResult`.

    Time (``max_word_tokens=1``): one forward of <= ~220 tokens per passage; 400 items over the
    36 held-out passages took 33-123 s on Gemma-3-270M and 42-49 s on SmolLM2-135M (2 shared
    cores, measured).
    """
    t0 = time.perf_counter()
    bos_id = model.bos_id(bos)
    items = make_cloze_items(model, n_items, n_candidates, seed, texts, split, min_context,
                             max_context, max_word_tokens)
    scores = _score_cloze(model, items, bos_id, intervene, batch_bytes, progress,
                          desc=f"cloze ({'BOS' if bos else 'no BOS'})")
    target = np.asarray([it.target for it in items], np.int64)
    correct, chosen, margin = _outcome(scores, target)
    return ClozeResult(correct=correct, target=target, chosen=chosen, scores=scores, margin=margin,
                       passage=np.asarray([it.passage for it in items], np.int64),
                       context_tokens=np.asarray([it.cut for it in items], np.int64),
                       words=[list(it.words) for it in items], seconds=time.perf_counter() - t0,
                       bos=bool(bos), bos_token_id=bos_id, n_candidates=int(n_candidates),
                       split=split if texts is None else "custom", seed=int(seed),
                       min_context=int(min_context), max_context=int(max_context),
                       max_word_tokens=None if max_word_tokens is None else int(max_word_tokens),
                       model=model.name, intervention=_intervention_name(intervene))


# ====================================================================== comparisons
TaskResult = Union[RetrievalResult, ClozeResult]


def compare(a: TaskResult, b: TaskResult, length: Optional[int] = None, exact: bool = False,
            seed: Optional[int] = None) -> Interval:
    """Paired bootstrap interval of accuracy(b) - accuracy(a) over the same items.

    Args:
        a, b: two results of the same task on the same items (same seed and settings, e.g. with
            and without BOS, or with and without an intervention).
        length: for retrieval, one length (None: all trials pooled).
        exact: for retrieval, compare the greedy exact-match outcome instead.

    Raises:
        ValueError: different tasks or different items.
    """
    if type(a) is not type(b):
        raise ValueError(f"cannot compare a {type(a).__name__} with a {type(b).__name__}")
    if not a.same_items(b):  # type: ignore[arg-type]  # type(a) is type(b), checked above
        raise ValueError("the two results were not measured on the same items (seed, lengths, "
                         "n_keys / n_candidates and texts must match)")
    return paired_difference(a.correct_at(length, exact).astype(float),
                             b.correct_at(length, exact).astype(float), seed=seed)
