"""Model quality with and without the BOS token: offline stand-ins for the benchmarks on which the
paper's authors report Gemma 7B collapsing when its ⟨bos⟩ is removed at inference.

Two measurements, each run once with the model's BOS prepended and once without:

**Held-out perplexity** (:func:`perplexity`). A text is tokenized without BOS, x_0 .. x_{n-1}
(n cut to ``max_tokens``, and to the context length minus one so that both conditions fit). The
predicted tokens are x_1 .. x_{n-1} in *both* conditions: with BOS the model reads
[BOS, x_0, .., x_{n-1}] and the prediction of x_0 from the BOS alone is *not* scored (there is no
counterpart without BOS); without BOS it reads [x_0, .., x_{n-1}]. The NLL of token x_j is
-log softmax(logits)[x_j] in nats, computed in float64 from the float32 logits of the position
before it. The reported ``mean_nll`` pools all predicted tokens of all texts (token-weighted);
``perplexity = exp(mean_nll)``. Default texts: the shipped passages' ``"heldout"`` split.

**Passkey retrieval** (:func:`passkey`). A random 5-digit pass key is hidden at a random depth in
filler text ("The grass is green. The sky is blue. ..."), after an instruction to remember it and
before the question "What is the pass key?"; the prompt ends with the cue "The pass key is" and
the answer is " 12345" (SmolLM2 writes it as a space token and one token per digit). Scoring
(``method``):

* ``"forced"`` (default): one forward pass over [BOS] + prompt + answer; a trial is correct when
  the argmax at every answer position is the answer token. This is *exactly* the event "greedy
  decoding emits the answer tokens", because greedy decoding emits the answer iff at each step,
  given the correct prefix, the argmax is the next answer token. ``digit_accuracy`` is the
  fraction of answer tokens that are the argmax given the correct prefix.
* ``"greedy"``: real greedy decoding, one full forward per new token (there is no KV cache), of
  as many tokens as the answer has; correct iff they equal the answer. Slower, same verdict.

``length`` is the number of tokens of the scored sequence [BOS slot] + prompt + answer; the
prompt is the same text in both conditions, so without BOS the sequence is one token shorter. A
generated prompt hits ``length`` from below within one filler sentence (at most ~7 tokens).

With ``template="chat"`` the prompt is wrapped in ChatML ("<|im_start|>user\\n ... <|im_end|>\\n
<|im_start|>assistant\\nThe pass key is"). When the model's BOS token *is* "<|im_start|>"
(SmolLM2-Instruct), the template's leading "<|im_start|>" is the BOS: with BOS the model sees the
exact chat template, without BOS the sequence starts at "user". Default ``"plain"``: no template.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..inputs import BOS, CONDITIONS, NOBOS, ByCondition, by_condition, prepare
from ..batching import run_each
from ..progress import progress_bar
from ..prompts import load_passages
from ..results import load_tagged_json, save_tagged_json, to_jsonable
from ..reprs import compact_repr

QUALITY_FORMAT = "sinklab.QualityReport/1"
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
          "There and back again.")
INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
         "Find it and memorize it. I will quiz you about the important information there.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key?"
CUE = "The pass key is"
TEMPLATES = ("plain", "chat")
METHODS = ("forced", "greedy")
QUICK_LENGTHS = (256, 512, 1024)
QUICK_TRIALS = 3
DEFAULT_TRIALS = 10


def log_sum_exp_rows(logits: np.ndarray, chunk: int = 2) -> np.ndarray:
    """log Σ_v exp(logits[r, v]) per row in float64, (N, V) -> (N,): each row's maximum subtracted,
    exp and sum in float64, over row chunks of ``chunk`` converted in place (a 262k vocabulary
    needs no float64 copy of all the logits, and each chunk stays in cache: 3x faster than one
    float64 pass over the whole array, and bitwise the same numbers)."""
    z = np.asarray(logits)
    out = np.empty(len(z), np.float64)
    for r0 in range(0, len(z), chunk):
        zc = z[r0: r0 + chunk].astype(np.float64)
        mx = zc.max(axis=1, keepdims=True)
        zc -= mx
        np.exp(zc, out=zc)
        out[r0: r0 + len(zc)] = mx[:, 0] + np.log(zc.sum(axis=1))
    return out


def nll_rows(logits: np.ndarray, targets: np.ndarray, chunk: int = 2) -> np.ndarray:
    """Next-token cross-entropy per row in nats: -log softmax(logits)[target] (the log-sum-exp of
    :func:`log_sum_exp_rows`); logits (N, V), targets (N,) ints in [0, V) -> (N,) float64."""
    z = np.asarray(logits)
    t = np.asarray(targets, np.int64)
    return log_sum_exp_rows(z, chunk) - z[np.arange(len(t)), t].astype(np.float64)


# ====================================================================== perplexity
@compact_repr
@dataclass
class PerplexityResult:
    """Held-out perplexity of one condition (with or without BOS).

    Attributes:
        mean_nll: token-weighted mean NLL in nats over all predicted tokens.
        perplexity: exp(mean_nll).
        nll: (N,) float64, each text's mean NLL (nats) over its predicted tokens.
        n_predicted: (N,) int64, tokens predicted per text (its token count - 1).
        bos, bos_token_id, max_tokens, model: the setting.
        seconds: wall time.
    """

    mean_nll: float
    perplexity: float
    nll: np.ndarray
    n_predicted: np.ndarray
    bos: bool
    bos_token_id: Optional[int]
    max_tokens: int
    model: str
    seconds: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.update(format="sinklab.PerplexityResult/1")
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PerplexityResult":
        d = {k: v for k, v in d.items() if k != "format"}
        d["nll"] = np.asarray(d["nll"], np.float64)
        d["n_predicted"] = np.asarray(d["n_predicted"], np.int64)
        return cls(**d)


def perplexity(model, texts: Optional[Sequence[Union[str, Sequence[int], np.ndarray]]] = None, bos: bool = True,
               max_tokens: int = 1024, intervene=None, progress: bool = True,
               desc: Optional[str] = None, batch_bytes: Optional[int] = None) -> PerplexityResult:
    """Held-out perplexity over ``texts`` with or without BOS, on the same predicted tokens.

    Args:
        model: a :class:`sinklab.Model`.
        texts: strings, or 1-D arrays of token ids without BOS; default the shipped passages'
            ``"heldout"`` split (36 passages, 120-220 tokens each).
        bos: prepend the model's BOS token (its own prediction target x_0 is never scored).
        max_tokens: each text is cut to its first ``max_tokens`` tokens (and to the context
            length - 1). Memory: the forward keeps (n, vocab) float32 logits, 0.2 GB at n=1024
            for a 49k vocabulary.
        intervene: an optional :class:`sinklab.Intervention` applied in every forward.
        progress: show a tqdm bar over texts.
        desc: the progress bar's label (default: "perplexity (BOS)" or "perplexity (no BOS)");
            name the condition when several runs differ only by ``intervene``.
        batch_bytes: cap in bytes on the logits of one forward call: texts run together,
            longest first, as zero-padded batches with explicit lengths (texts of equal token
            count alone where ``Model.run`` has no ``lengths=``), as many as fit (default
            :data:`sinklab.batching.BATCH_BYTES`, 256 MiB: 1 text of 1024 tokens or 5 of 220 on
            a 49k vocabulary). The numbers are bitwise the same for any cap.

    Returns:
        :class:`PerplexityResult`; ``mean_nll`` in nats per predicted token.
    """
    if texts is None:
        texts = load_passages("heldout")
    if isinstance(texts, str):
        raise TypeError("texts must be a list of texts, not a single string")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty")
    if int(max_tokens) < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
    cap = min(int(max_tokens), model.config.context_length - 1)
    bos_id = model.bos_id(bos)
    t0 = time.perf_counter()
    xs = []
    for i, t in enumerate(texts):
        x = prepare(model, t, False, cap)        # the text tokens x_0 .. x_{n-1}, same in both conditions
        if len(x) < 2:
            raise ValueError(f"text {i} has {len(x)} token(s); at least 2 are needed to predict one")
        xs.append(x)
    seqs = [prepare(model, x, bos) for x in xs]  # the BOS on top of the n text tokens
    start = 1 if bos else 0                      # with BOS, skip the row predicting x_0
    nll, counts = [0.0] * len(xs), [0] * len(xs)
    for i, tr in run_each(model, seqs, ("logits",), logits_from=start, intervene=intervene,
                          batch_bytes=batch_bytes, progress=progress, unit="text", ragged=True,
                          desc=desc or f"perplexity ({'BOS' if bos else 'no BOS'})"):
        v = nll_rows(tr.logits[: len(xs[i]) - 1], xs[i][1:])    # predict x_1 .. x_{n-1}
        nll[i], counts[i] = float(v.mean()), len(v)
    nll_a, cnt = np.asarray(nll, np.float64), np.asarray(counts, np.int64)
    mean = float((nll_a * cnt).sum() / cnt.sum())
    return PerplexityResult(mean_nll=mean, perplexity=math.exp(mean), nll=nll_a, n_predicted=cnt,
                            bos=bool(bos), bos_token_id=bos_id, max_tokens=cap, model=model.name,
                            seconds=time.perf_counter() - t0)


# ====================================================================== passkey
@dataclass
class PasskeyPrompt:
    """One generated passkey prompt.

    Attributes:
        ids: (n,) int64 prompt tokens without BOS, ending with the cue "The pass key is".
        answer: (m,) int64 answer tokens (" " and the digits for SmolLM2).
        passkey: the number, as a string of digits.
        depth: where the needle sits, as a fraction of the filler sentences (0 = start, 1 = end).
        length: the requested length; ``n_tokens`` the real one (BOS slot + prompt + answer).
        n_filler: filler sentences used.
        template: ``"plain"`` or ``"chat"``.
        text: the prompt text (without the answer).
    """

    ids: np.ndarray
    answer: np.ndarray
    passkey: str
    depth: float
    length: int
    n_filler: int
    template: str
    text: str

    @property
    def n_tokens(self) -> int:
        """Tokens of [BOS slot] + prompt + answer: what ``length`` targets."""
        return 1 + len(self.ids) + len(self.answer)

    def sequence(self, bos_id: Optional[int]) -> np.ndarray:
        """(T,) int64 scored sequence: [BOS] + prompt + answer, or prompt + answer."""
        parts = ([[bos_id]] if bos_id is not None else []) + [self.ids, self.answer]
        return np.concatenate(parts).astype(np.int64)


def _template_text(n_filler: int, depth: float, key: str, template: str) -> str:
    sentences = [FILLER[j % len(FILLER)] for j in range(n_filler)]
    sentences.insert(int(round(depth * n_filler)), NEEDLE.format(key=key))
    body = " ".join([INTRO] + sentences + [QUESTION])
    if template == "chat":
        return f"<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n{CUE}"
    return f"{body} {CUE}"


def make_passkey_prompt(model, length: int, seed: Union[int, Sequence[int], np.random.Generator] = 0,
                        depth: Optional[float] = None, digits: int = 5,
                        template: str = "plain") -> PasskeyPrompt:
    """A passkey prompt whose scored sequence has at most ``length`` tokens (and at least
    ``length`` minus one filler sentence).

    Args:
        model: a :class:`sinklab.Model` (its tokenizer and BOS token are used).
        length: target tokens of [BOS slot] + prompt + answer.
        seed: an int, a sequence of ints, or a NumPy Generator; the key and (if None) the depth
            are drawn from it, so a seed fixes the prompt.
        depth: needle position in [0, 1] (fraction of the filler), or None for uniform random.
        digits: digits of the pass key (no leading zero).
        template: ``"plain"`` or ``"chat"`` (see the module docstring).
    """
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    key = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
    d = float(rng.uniform()) if depth is None else float(depth)
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    length = int(length)
    ctx = model.config.context_length
    if length > ctx:
        raise ValueError(f"passkey length {length} exceeds the model's context length {ctx}")
    bos_id = model.config.bos_token_id
    strip_bos = (template == "chat" and bos_id is not None
                 and model.detokenize([bos_id]) == "<|im_start|>")

    def encode(n: int) -> Tuple[np.ndarray, np.ndarray, str]:
        text = _template_text(n, d, key, template)
        prompt = np.asarray(model.tokenize(text, bos=False), np.int64)
        full = np.asarray(model.tokenize(text + " " + key, bos=False), np.int64)
        if len(full) <= len(prompt) or not np.array_equal(full[: len(prompt)], prompt):
            raise RuntimeError("the tokenizer merges the answer into the cue; passkey needs them apart")
        answer = full[len(prompt):]
        if strip_bos and prompt[0] == bos_id:
            prompt = prompt[1:]
        return prompt, answer, text

    def size(n: int) -> int:
        p, a, _ = encode(n)
        return 1 + len(p) + len(a)

    base = size(0)
    if base > length:
        raise ValueError(f"passkey length {length} is too short: the prompt without filler already "
                         f"has {base} tokens")
    per = (size(50) - base) / 50.0
    n = max(0, int((length - base) / per))
    while n > 0 and size(n) > length:
        n -= max(1, int((size(n) - length) / per))
        n = max(n, 0)
    while size(n + 1) <= length:
        n += 1
    p, a, text = encode(n)
    return PasskeyPrompt(ids=p, answer=a, passkey=key, depth=d, length=length, n_filler=n,
                         template=template, text=text)


@dataclass
class PasskeyTrial:
    length: int
    n_tokens: int
    depth: float
    passkey: str
    predicted: str
    correct: bool
    digit_accuracy: float


@compact_repr
@dataclass
class PasskeyResult:
    """Passkey accuracy per length, for one condition.

    Attributes:
        accuracy: {length: fraction of trials answered exactly} (in [0, 1]).
        digit_accuracy: {length: mean fraction of answer tokens that were the argmax}.
        seconds: {length: wall seconds for that length's trials}.
        trials: every trial (length, tokens, depth, key, prediction, verdict).
        bos, bos_token_id, template, method, seed, model: the setting.
    """

    accuracy: Dict[int, float]
    digit_accuracy: Dict[int, float]
    seconds: Dict[int, float]
    trials: List[PasskeyTrial]
    bos: bool
    bos_token_id: Optional[int]
    template: str
    method: str
    seed: int
    model: str

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        for k in ("accuracy", "digit_accuracy", "seconds"):
            d[k] = {str(n): v for n, v in d[k].items()}
        d["format"] = "sinklab.PasskeyResult/1"
        return to_jsonable(d)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PasskeyResult":
        d = {k: v for k, v in d.items() if k != "format"}
        for k in ("accuracy", "digit_accuracy", "seconds"):
            d[k] = {int(n): float(v) for n, v in d[k].items()}
        d["trials"] = [PasskeyTrial(**t) for t in d["trials"]]
        return cls(**d)


def default_lengths(model, quick: bool = False) -> Tuple[int, ...]:
    """(256, 512, 1024) when ``quick``, else powers of two from 256 up to the context length."""
    ctx = model.config.context_length
    if quick:
        return tuple(n for n in QUICK_LENGTHS if n <= ctx) or (ctx,)
    out, n = [], 256
    while n <= ctx:
        out.append(n)
        n *= 2
    return tuple(out) or (ctx,)


def _verdict(model, p: PasskeyPrompt, pred: np.ndarray) -> Tuple[str, bool, float]:
    """(decoded prediction, all answer tokens right, fraction right) of predicted answer tokens."""
    hits = pred == p.answer
    return model.detokenize(pred), bool(hits.all()), float(hits.mean())


def _greedy(model, p: PasskeyPrompt, bos_id: Optional[int]) -> np.ndarray:
    """Greedy decoding of len(p.answer) tokens after [BOS] + prompt, one full forward each."""
    ctx = np.concatenate([[bos_id] if bos_id is not None else [], p.ids]).astype(np.int64)
    pred = []
    for _ in range(len(p.answer)):
        tr = model.run(ctx, capture=("logits",), logits_from=-1, progress=False)
        nxt = int(tr.logits[-1].argmax())
        pred.append(nxt)
        ctx = np.append(ctx, nxt)
    return np.asarray(pred, np.int64)


def _score_all(model, prompts: List[PasskeyPrompt], bos_id: Optional[int], method: str,
               batch_bytes: Optional[int], bar: Any) -> List[Tuple[str, bool, float]]:
    """:func:`_verdict` of every prompt, in order; ``"forced"`` runs the trials of equal token
    count together (:func:`sinklab.batching.run_each`), ``"greedy"`` one by one."""
    out: List[Any] = [None] * len(prompts)
    if method == "forced":
        seqs = [p.sequence(bos_id) for p in prompts]
        lf = [-(len(p.answer) + 1) for p in prompts]
        for i, tr in run_each(model, seqs, ("logits",), logits_from=lf, batch_bytes=batch_bytes,
                              progress=False):
            out[i] = _verdict(model, prompts[i], tr.logits[: len(prompts[i].answer)].argmax(axis=-1))
            bar.update(1)
        return out
    for i, p in enumerate(prompts):
        out[i] = _verdict(model, p, _greedy(model, p, bos_id))
        bar.update(1)
    return out


def passkey(model, lengths: Optional[Sequence[int]] = None, trials: Optional[int] = None,
            bos: bool = True, seed: int = 0, depths: Optional[Sequence[float]] = None,
            template: str = "plain", method: str = "forced", quick: bool = False,
            progress: bool = True, batch_bytes: Optional[int] = None) -> PasskeyResult:
    """Passkey retrieval accuracy per length (a local stand-in for the RULER long-context benchmark).

    Args:
        model: a :class:`sinklab.Model`.
        lengths: target sequence lengths in tokens (see the module docstring); default
            :func:`default_lengths` (256 .. context length; ``quick``: 256, 512, 1024).
        trials: prompts per length (default 10; ``quick``: 3).
        bos: prepend the model's BOS token. The prompts do not depend on ``bos``: the same seed
            gives the same keys, depths and texts with and without BOS.
        seed: prompt ``t`` of length ``n`` is drawn from ``default_rng([seed, n, t])``.
        depths: fixed needle depths in [0, 1] cycled over trials, instead of random ones.
        template: ``"plain"`` or ``"chat"``.
        method: ``"forced"`` (one forward per trial; same verdict as greedy decoding) or
            ``"greedy"`` (real decoding, one forward per answer token).
        quick: small defaults for a fast run.
        progress: tqdm bar over trials.
        batch_bytes: with ``"forced"``, the trials of one length that have the same token count
            run together, in batches whose logits fit in ``batch_bytes`` (default
            :data:`sinklab.batching.BATCH_BYTES`); the verdicts are the same for any cap.

    Returns:
        :class:`PasskeyResult` with ``accuracy[length]`` in [0, 1].

    Time: one forward of ``length`` tokens per trial; SmolLM2-135M on 2 cores takes of the order
    of 1 s at 512 tokens, 10 s at 2048 and minutes at 8192.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
    lengths = tuple(int(n) for n in (lengths if lengths is not None else default_lengths(model, quick)))
    if not lengths:
        raise ValueError("lengths is empty")
    ctx = model.config.context_length
    for n in lengths:
        if n > ctx:
            raise ValueError(f"passkey length {n} exceeds the model's context length {ctx}")
    trials = int(trials if trials is not None else (QUICK_TRIALS if quick else DEFAULT_TRIALS))
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    bos_id = model.bos_id(bos)
    acc, dacc, secs, out = {}, {}, {}, []
    bar = progress_bar(None, progress, desc=f"passkey ({'BOS' if bos else 'no BOS'})",
                       total=len(lengths) * trials, unit="trial")
    for n in lengths:
        t0 = time.perf_counter()
        prompts = [make_passkey_prompt(model, n, seed=[int(seed), n, t], template=template,
                                       depth=None if depths is None else float(depths[t % len(depths)]))
                   for t in range(trials)]
        res = [PasskeyTrial(length=n, n_tokens=p.n_tokens - (0 if bos else 1), depth=p.depth,
                            passkey=p.passkey, predicted=pred, correct=ok, digit_accuracy=da)
               for p, (pred, ok, da) in zip(prompts, _score_all(model, prompts, bos_id, method,
                                                                 batch_bytes, bar))]
        secs[n] = time.perf_counter() - t0
        acc[n] = float(np.mean([r.correct for r in res]))
        dacc[n] = float(np.mean([r.digit_accuracy for r in res]))
        out.extend(res)
    bar.close()
    return PasskeyResult(accuracy=acc, digit_accuracy=dacc, seconds=secs, trials=out, bos=bool(bos),
                         bos_token_id=bos_id, template=template, method=method, seed=int(seed),
                         model=model.name)


# ====================================================================== both conditions
@compact_repr
@dataclass
class QualityReport:
    """Perplexity and passkey accuracy with and without BOS (offline stand-in for the paper's ⟨bos⟩-removal benchmarks)."""

    perplexity: Dict[str, PerplexityResult]
    passkey: Dict[str, PasskeyResult]
    seconds: Dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # keyed by the condition names of sinklab.inputs ("bos"/"nobos"; the older
        # "with_bos"/"without_bos" still read)
        self.perplexity = by_condition(self.perplexity)
        self.passkey = by_condition(self.passkey)

    def table(self) -> str:
        """Markdown: perplexity and passkey accuracy per length, with vs without BOS."""
        w, wo = self.perplexity[BOS], self.perplexity[NOBOS]
        lines = ["| | with BOS | without BOS |", "|---|---|---|",
                 f"| held-out perplexity ({int(w.n_predicted.sum())} tokens) | {w.perplexity:.2f} "
                 f"| {wo.perplexity:.2f} |",
                 f"| mean NLL (nats/token) | {w.mean_nll:.4f} | {wo.mean_nll:.4f} |"]
        pw, pwo = self.passkey[BOS], self.passkey[NOBOS]
        for n in pw.accuracy:
            k = sum(1 for t in pw.trials if t.length == n)
            lines.append(f"| passkey @ {n} tokens ({k} trials) | {100 * pw.accuracy[n]:.0f}% "
                         f"| {100 * pwo.accuracy.get(n, float('nan')):.0f}% |")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        return to_jsonable({"format": QUALITY_FORMAT,
                            "perplexity": {k: v.to_dict() for k, v in self.perplexity.items()},
                            "passkey": {k: v.to_dict() for k, v in self.passkey.items()},
                            "seconds": self.seconds})

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the report as JSON."""
        save_tagged_json(path, QUALITY_FORMAT, {k: v for k, v in self.to_dict().items() if k != "format"})

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "QualityReport":
        d = load_tagged_json(path, QUALITY_FORMAT)
        """Reads what :meth:`save` wrote (older files keyed ``with_bos``/``without_bos`` too)."""
        return cls(perplexity={k: PerplexityResult.from_dict(v) for k, v in d["perplexity"].items()},
                   passkey={k: PasskeyResult.from_dict(v) for k, v in d["passkey"].items()},
                   seconds=d.get("seconds", {}))


def compare_bos_quality(model, quick: bool = False, texts: Optional[Sequence[str]] = None,
                        max_tokens: int = 1024, lengths: Optional[Sequence[int]] = None,
                        trials: Optional[int] = None, seed: int = 0, template: str = "plain",
                        method: str = "forced", progress: bool = True,
                        perplexities: Optional[Dict[str, PerplexityResult]] = None,
                        batch_bytes: Optional[int] = None) -> QualityReport:
    """:func:`perplexity` and :func:`passkey` with and without BOS, on identical inputs.

    ``quick``: passkey at 256/512/1024 tokens with 3 trials each (perplexity is always over
    all of ``texts``). Wall seconds of each part are in ``seconds``. ``perplexities``: results
    already computed on the same texts ({"bos": ..., "nobos": ...}), reused instead of
    running the perplexity forwards again. ``batch_bytes``: the cap on one batched forward's
    captures, passed to both (:data:`sinklab.batching.BATCH_BYTES` by default).
    """
    ppl, pk, secs = by_condition(dict(perplexities or {})), ByCondition(), {}
    for key in CONDITIONS:
        b = key == BOS
        if key not in ppl:
            t0 = time.perf_counter()
            ppl[key] = perplexity(model, texts, bos=b, max_tokens=max_tokens, progress=progress,
                                  batch_bytes=batch_bytes)
            secs[f"perplexity_{key}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        pk[key] = passkey(model, lengths=lengths, trials=trials, bos=b, seed=seed, template=template,
                          method=method, quick=quick, progress=progress, batch_bytes=batch_bytes)
        secs[f"passkey_{key}"] = time.perf_counter() - t0
    return QualityReport(perplexity=ppl, passkey=pk, seconds=secs)
