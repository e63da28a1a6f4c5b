"""Sink-head ablation against matched controls, beyond the paper: does removing the heads that
attend most to position 0 hurt the model more than removing as many other heads of the same
layers?

Question answered: with the top-n sink heads (largest mean first-token importance a_0, among the
heads with mean a_0 > ε, :mod:`sinklab.analysis.sinks`) switched off (``head_scale`` 0: the head
writes nothing before W_O, :class:`sinklab.Intervention`), how much does next-token NLL rise over
the unablated model, and how does that compare with switching off n random *non-sink* heads drawn
with the same number of heads in each layer (a matched layer histogram), over many draws? A
cheap task delta comes from the same forward: the change of next-token top-1 accuracy.

Two ablations (``ablation``): ``"zero"`` scales the head's output by 0 (``head_scale``);
``"mean"`` (mean-ablation) replaces the head's output z_h (what W_O reads) at every position with
its mean over reference prompts (``mean_prompts``, by default 16 of the shipped held-out passages,
disjoint from the default prompts) and all their positions in the unablated model (an
:mod:`activation patch <sinklab.patching>` of ``z``), which keeps the constant part of what the head
writes: a sink head whose output is near a constant (attention parked on ⟨bos⟩, whose value is
small) should then cost less than under zero-ablation. The reference must not be the evaluated
prompts: a mean over them carries their content into every position (on SmolLM2, 6 prompts of 64
tokens, 8 draws: mean-ablating matched random heads changed the NLL by -0.076 nats with the
in-sample mean, -0.052 [-0.078, -0.020] with the held-out one).

Heads are chosen greedily by a_0, a head being taken only while its layer still has an unchosen
non-sink head to match it (so every draw can match the histogram); n is at most ``n_top``.
Baseline a_0 and all NLLs are measured on the same P prompts (their first T tokens, the model's
own ⟨bos⟩ rule). Per prompt p: Δ_sink[p] = NLL(sink heads off) − NLL(none), Δ_rand[d, p] for
draw d; intervals are 95 % bootstraps over prompts of Δ_sink, of the draw-mean Δ_rand and of their
paired difference; ``exceed`` is the fraction of draws whose prompt-mean Δ_rand reaches the
prompt-mean Δ_sink (an empirical p-value over draws).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from ..interventions import Intervention
from ..patching import Patch
from ..progress import progress_bar
from ..prompts import load_passages
from ..reprs import compact_repr
from ..results import to_jsonable
from .massive import sequences
from .quality import nll_rows
from .sinks import check_eps
from .stats import Interval, mean_ci

Prompt = Union[str, Sequence[int], np.ndarray]
FORMAT = "sinklab.HeadAblation/1"


@compact_repr
@dataclass
class HeadAblation:
    """Sink heads against matched random heads (see the module docstring).

    Attributes (P prompts, D draws, L layers, H heads, n ablated heads):
        a0: (L, H) float64, mean first-token importance over prompts (unablated).
        sink_heads: (n, 2) int64 (layer, head) of the ablated top sink heads.
        random_heads: (D, n, 2) int64, each draw's non-sink heads (same per-layer counts).
        nll_base: (P,) float64 mean NLL (nats) per prompt, no ablation; ``nll_sink`` (P,) with the
            sink heads off; ``nll_random`` (D, P) with each draw's heads off.
        acc_base, acc_sink (P,), acc_random (D, P): next-token top-1 accuracy per prompt.
        eps, T, bos, model: the setting; n_sink_total the heads with mean a_0 > eps.
        ablation: ``"zero"`` or ``"mean"`` (module docstring).
    """

    a0: np.ndarray
    sink_heads: np.ndarray
    random_heads: np.ndarray
    nll_base: np.ndarray
    nll_sink: np.ndarray
    nll_random: np.ndarray
    acc_base: np.ndarray
    acc_sink: np.ndarray
    acc_random: np.ndarray
    eps: float
    T: int
    bos: bool
    model: str
    n_sink_total: int
    ablation: str = "zero"
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(len(self.sink_heads))

    def dnll_sink(self) -> Interval:
        """ΔNLL (nats) of ablating the sink heads, over prompts."""
        return mean_ci(self.nll_sink - self.nll_base, seed=0)

    def dnll_random(self) -> Interval:
        """ΔNLL (nats) of ablating matched random non-sink heads, draws averaged per prompt."""
        return mean_ci((self.nll_random - self.nll_base[None]).mean(axis=0), seed=0)

    def dnll_difference(self) -> Interval:
        """ΔNLL(sink) − ΔNLL(random), paired over prompts: > 0 means the sink heads matter more."""
        return mean_ci(self.nll_sink - self.nll_random.mean(axis=0), seed=0)

    def dacc_sink(self) -> Interval:
        return mean_ci(self.acc_sink - self.acc_base, seed=0)

    def dacc_random(self) -> Interval:
        return mean_ci((self.acc_random - self.acc_base[None]).mean(axis=0), seed=0)

    def exceed(self) -> float:
        """Fraction of draws whose mean ΔNLL over prompts is >= the sink heads' mean ΔNLL."""
        d_sink = float(np.mean(self.nll_sink - self.nll_base))
        d_rand = (self.nll_random - self.nll_base[None]).mean(axis=1)
        return float(np.mean(d_rand >= d_sink)) if len(d_rand) else float("nan")

    def to_dict(self) -> Dict[str, Any]:
        d = to_jsonable(asdict(self))
        d["format"] = FORMAT
        return d


def top_sink_heads(a0: np.ndarray, eps: float, n_top: int) -> np.ndarray:
    """(n, 2) (layer, head) of the heads with the largest a0 (> eps), greedily, each taken only while
    its layer keeps more non-sink heads than it has chosen heads (so a matched draw exists)."""
    sink = a0 > eps
    spare = (~sink).sum(axis=1)
    taken = np.zeros(a0.shape[0], np.int64)
    out = []
    for flat in np.argsort(-a0, axis=None, kind="stable"):
        l, h = np.unravel_index(flat, a0.shape)
        if len(out) >= n_top or not sink[l, h]:
            break
        if taken[l] < spare[l]:
            taken[l] += 1
            out.append((int(l), int(h)))
    return np.asarray(out, np.int64).reshape(-1, 2)


def matched_random_heads(a0: np.ndarray, eps: float, heads: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, 2): per layer of ``heads``, as many non-sink heads (a0 <= eps) of that layer, uniformly
    without replacement."""
    out = []
    layers, counts = np.unique(heads[:, 0], return_counts=True) if len(heads) else ([], [])
    for l, c in zip(layers, counts):
        pool = np.flatnonzero(a0[l] <= eps)
        out.extend((int(l), int(h)) for h in rng.choice(pool, size=int(c), replace=False))
    return np.asarray(out, np.int64).reshape(-1, 2)


def _scales(L: int, H: int, heads: np.ndarray) -> Intervention:
    s = np.ones((L, H), np.float32)
    s[heads[:, 0], heads[:, 1]] = 0.0
    return Intervention(head_scale=s)


def _mean_patches(z_mean: np.ndarray, heads: np.ndarray, T: int) -> List[Patch]:
    """One ``z`` patch per layer of ``heads``: those heads' outputs at all T positions replaced by
    their means z_mean (L, H, hd)."""
    out = []
    for l in np.unique(heads[:, 0]):
        hs = heads[heads[:, 0] == l, 1]
        value = np.broadcast_to(z_mean[l, hs][:, None, :], (len(hs), T, z_mean.shape[2]))
        out.append(Patch("z", value.astype(np.float32), layer=int(l), heads=hs))
    return out


ABLATIONS = ("zero", "mean")
MEAN_PROMPTS = 16


def mean_head_outputs(model: Any, prompts: Optional[Sequence[Prompt]], T: int, bos: bool) -> np.ndarray:
    """(L, H, hd) float64: each head's z (what W_O reads) averaged over the reference prompts'
    first T tokens and all their positions, unablated."""
    if prompts is None:
        prompts = load_passages("heldout")[:MEAN_PROMPTS]
    seqs, _, _ = sequences(model, prompts, T, bos, skip_short=True)
    if not len(seqs):
        raise ValueError(f"mean ablation needs >= 1 reference prompt of T={T} tokens")
    c = model.config
    total = np.zeros((c.n_layers, c.n_heads, c.head_dim))
    for ids in seqs:
        total += model.run(ids, capture="z", progress=False).z.astype(np.float64).sum(axis=2)
    return total / (len(seqs) * seqs.shape[1])


def head_ablation(model: Any, prompts: Optional[Sequence[Prompt]] = None, T: int = 128, n_top: int = 8,
                  draws: int = 20, eps: float = 0.3, bos: Optional[bool] = None, seed: int = 0,
                  progress: bool = True, ablation: str = "zero",
                  mean_prompts: Optional[Sequence[Prompt]] = None) -> HeadAblation:
    """Ablates the top sink heads and ``draws`` matched sets of random non-sink heads; NLL and
    top-1 accuracy per prompt for each (see the module docstring).

    Args:
        model: a causal :class:`sinklab.Model` with an LM head.
        prompts: texts or token arrays (default the shipped ``"sinks"`` passages), >= 2 long enough.
        T: tokens per prompt (⟨bos⟩ included when used).
        n_top: the most sink heads ablated.
        draws: random matched draws (>= 1), ``numpy.random.default_rng([seed, d])``.
        eps: the sink threshold on mean a_0 (0 < eps < 1).
        bos: lead with the model's ⟨bos⟩; None: the model's own rule.
        progress: a progress bar over the runs.
        ablation: ``"zero"`` (the head writes nothing) or ``"mean"`` (its output is its mean over
            ``mean_prompts`` and their positions), module docstring.
        mean_prompts: the mean-ablation's reference prompts, cut to the same T (default: the first
            16 shipped held-out passages); unused with ``"zero"``.

    Returns:
        A :class:`HeadAblation`; ValueError when no head can be matched or a setting is bad.
    """
    eps = check_eps(eps)
    if not model.config.has_lm_head or model.config.bidirectional:
        raise ValueError(f"{model.name}: head ablation needs a causal language model with an LM head")
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation={ablation!r}; expected one of {ABLATIONS}")
    if int(n_top) < 1 or int(draws) < 1:
        raise ValueError(f"n_top={n_top} and draws={draws} must be >= 1")
    if bos is None:
        bos = bool(getattr(model.tokenizer, "add_bos_default", False)) and model.config.bos_token_id is not None
    if prompts is None:
        prompts = load_passages("sinks")[:8]
    seqs, _, _ = sequences(model, prompts, T, bool(bos), skip_short=True)
    if len(seqs) < 2:
        raise ValueError(f"head ablation needs >= 2 prompts of T={T} tokens, got {len(seqs)}")
    L, H = model.config.n_layers, model.config.n_heads
    conds = ["base", "sink"] + [f"random_{d}" for d in range(int(draws))]
    nll = np.empty((len(conds), len(seqs)))
    acc = np.empty_like(nll)
    a0 = np.zeros((L, H))
    z_mean = None if ablation == "zero" else mean_head_outputs(model, mean_prompts, int(seqs.shape[1]), bool(bos))
    heads: Dict[str, np.ndarray] = {}
    tr = None
    bar = progress_bar(range(len(conds) * len(seqs)), progress, desc=f"head ablation ({model.name})", unit="run")
    it = iter(bar)
    for c, name in enumerate(conds):
        if c == 1:
            a0 /= len(seqs)
            heads["sink"] = top_sink_heads(a0, eps, int(n_top))
            if not len(heads["sink"]):
                raise ValueError(f"{model.name}: no sink head (mean a_0 > {eps}) with a non-sink head beside it "
                                 f"in its layer at T={T}")
        if name.startswith("random_"):
            heads[name] = matched_random_heads(a0, eps, heads["sink"], np.random.default_rng([seed, c - 2]))
        iv = patches = None
        if name != "base" and z_mean is None:
            iv = _scales(L, H, heads[name])
        elif name != "base":
            patches = _mean_patches(z_mean, heads[name], int(seqs.shape[1]))
        for p, ids in enumerate(seqs):
            next(it, None)
            cap = ("logits", "stats") if name == "base" else ("logits",)
            run = model.run(ids, capture=cap, intervene=iv, patch=patches, progress=False,
                            out=None if name == "base" else tr)
            if name != "base":
                tr = run  # its buffers are reused by the next ablated run
            if name == "base":
                a0 += run.stats.importance[:, :, 0]
            nll[c, p] = nll_rows(run.logits[:-1], ids[1:]).mean()
            acc[c, p] = float(np.mean(np.argmax(run.logits[:-1], axis=1) == ids[1:]))
    for _ in it:
        pass
    return HeadAblation(a0=a0, sink_heads=heads["sink"], random_heads=np.stack([heads[c] for c in conds[2:]]),
                        nll_base=nll[0], nll_sink=nll[1], nll_random=nll[2:], acc_base=acc[0], acc_sink=acc[1],
                        acc_random=acc[2:], eps=eps, T=int(seqs.shape[1]), bos=bool(bos), model=model.name,
                        n_sink_total=int((a0 > eps).sum()), ablation=ablation)
