"""Evaluation of a model in training: validation loss and sink rate on held-out documents, with
and without ⟨bos⟩ at inference (the rows of the paper's Table 2), and the validation loss in the
training format.

Protocol (:func:`evaluate`):

* Documents: the held-out documents with at least ``min_tokens`` (65) tokens, the first
  ``n_docs`` (64) of them in corpus order.
* Inputs, for a model trained with context C: x = the document's first min(len, C - 1) tokens;
  "⟨bos⟩+text" runs ids = [bos] + x, "text only" runs ids = x (both at most C tokens).
* Validation loss: the mean next-token cross-entropy (nats) over the SAME targets in both
  modes, the text tokens x[1:] (predicted from position p + 1 of [bos] + x, from position p of
  x), averaged over all (document, target) pairs; so the two losses differ only by what the
  model sees before the text, never by which tokens are scored. Logits come from the C forward
  (float32); the log-sum-exp is taken in float64.
* Sink rate: Gu et al.'s metric (the paper's §1): the importance of the first position,
  a_0 = 1/T sum_i A_{i,0}, per (document, layer, head) on the first T = min(64, C) tokens of the
  input ([bos] + the document's first T - 1 tokens, or its first T tokens), and the fraction of
  (document, layer, head) triples with a_0 > eps, for eps 0.3 and 0.8
  (the sink study's measurement on the captured attention). For C >= 65 these are
  exactly the first 64 tokens of the loss inputs above.
* Validation loss in the training format: the held-out token stream packed into windows by the
  same packer as training (same masking, same fixed ⟨bos⟩), ``n_windows`` of them from
  ``packer.batch(0, n_windows, seed)``, the mean cross-entropy over their targets, as
  :meth:`Trainer.step` reports the training loss. Table 2's intra-document rows need it.

Forward passes are batched as the perplexity and the sink study batch them, their captures
under ``batch_bytes`` per call.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..analysis.quality import nll_rows, perplexity
from ..analysis.sinks import check_eps, sink_rate_of
from ..analysis.sinkset import measure_first_importance

EPS = (0.3, 0.8)       # Gu et al.'s threshold and the paper's Table 1 one
SINK_TOKENS = 64       # T of the sink metric (Gu et al.)
MIN_TOKENS = 65        # a document long enough for 64 text tokens after a ⟨bos⟩ budget of 64 + 1 target
BATCH_BYTES = 256 << 20
MODES = ("bos", "text")  # "⟨bos⟩+text" and "text only"


def eval_documents(documents: Iterable[Any], n_docs: int = 64, min_tokens: int = MIN_TOKENS) -> List[np.ndarray]:
    """The first ``n_docs`` documents with at least ``min_tokens`` tokens, as int64 arrays.

    Raises:
        ValueError: no document is long enough.
    """
    if n_docs < 1:
        raise ValueError(f"n_docs must be at least 1, got {n_docs}")
    out, seen = [], 0
    for d in documents:
        seen += 1
        a = np.asarray(d).reshape(-1)
        if a.size >= min_tokens:
            out.append(a.astype(np.int64, copy=False))
            if len(out) == n_docs:
                break
    if not out:
        raise ValueError(f"none of the {seen} held-out documents has the {min_tokens} tokens evaluation needs")
    return out


def sink_inputs(doc: np.ndarray, T: int, bos_id: Optional[int], mode: str) -> np.ndarray:
    """The T tokens the sink metric runs: [bos] + doc[:T-1] ("bos") or doc[:T] ("text")."""
    d = np.asarray(doc, np.int64)
    if mode == "bos":
        if bos_id is None:
            raise ValueError("the model has no <bos> id: cannot evaluate '<bos>+text'")
        return np.concatenate([[int(bos_id)], d[:T - 1]]).astype(np.int64)
    return d[:T].copy()


def doc_loss(model: Any, docs: Sequence[np.ndarray], context: int, bos_id: Optional[int], mode: str,
             batch_bytes: int = BATCH_BYTES, progress: bool = False) -> Tuple[float, int]:
    """(sum of the cross-entropy over every target x[1:] of every document, number of targets)
    in ``mode``; see the module docstring. This is the held-out perplexity protocol of
    :func:`sinklab.analysis.quality.perplexity` with texts cut to C - 1 tokens."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "bos" and (bos_id is None or bos_id != model.config.bos_token_id):
        raise ValueError(f"'<bos>+text' needs the model's own <bos> id ({model.config.bos_token_id}), got {bos_id}")
    r = perplexity(model, [np.asarray(d, np.int64) for d in docs], bos=mode == "bos", max_tokens=context - 1,
                   progress=progress, desc=f"val loss ({mode})", batch_bytes=batch_bytes)
    n = int(r.n_predicted.sum())
    return r.mean_nll * n, n


def sink_importance(model: Any, docs: Sequence[np.ndarray], T: int, bos_id: Optional[int], mode: str,
                    batch_bytes: int = BATCH_BYTES, progress: bool = False) -> np.ndarray:
    """(N, L, H) float64 first-token importance a_0 of every document, layer and head on the
    sink inputs of ``mode`` (:func:`sink_inputs`), measured as the sink study measures it."""
    seqs = np.stack([sink_inputs(d, T, bos_id, mode) for d in docs])
    return measure_first_importance(model, seqs, "attn", progress, f"sink rate ({mode})", batch_bytes)[0]


def packed_loss(model: Any, packer: Any, n_windows: int, seed: int, keep_first: bool) -> Tuple[float, int]:
    """(sum of the cross-entropy over every target of ``n_windows`` packed windows, number of
    targets): the training loss's definition on windows ``packer.batch(0, n_windows, seed)``,
    run one window at a time with the packer's masking (``key_start``) and ``keep_first``."""
    ids, targets, key_start = packer.batch(0, n_windows, seed)
    ids = np.ascontiguousarray(ids, np.int64)
    targets = np.asarray(targets, np.int64)
    B = ids.shape[0]
    tr = None  # one logits buffer, refilled window after window (run's out=)
    total, count = 0.0, 0
    for b in range(B):
        ks = None if key_start is None else key_start[b]
        tr = model.run(ids[b], capture=("logits",), progress=False, out=tr, key_start=ks, keep_first=keep_first)
        keep = targets[b] >= 0
        if keep.any():
            total += float(nll_rows(tr.logits[keep], targets[b][keep]).sum())
            count += int(keep.sum())
    return total, count


def evaluate(model: Any, documents: Iterable[Any], context: int, bos_id: Optional[int], n_docs: int = 64,
             eps: Sequence[float] = EPS, sink_tokens: int = SINK_TOKENS, packer: Any = None,
             n_windows: int = 16, window_seed: int = 0, keep_first: bool = False,
             batch_bytes: int = BATCH_BYTES, progress: bool = False) -> Dict[str, Any]:
    """Validation loss and sink rates of ``model`` with and without ⟨bos⟩, by the protocol of
    the module docstring.

    Args:
        model: a :class:`sinklab.Model` (e.g. ``Trainer.model``, on the live weights).
        documents: the held-out documents (token-id arrays, no ⟨bos⟩), in corpus order.
        context: C, the training context length (tokens).
        bos_id: the ⟨bos⟩ id.
        n_docs: how many documents (of at least 65 tokens) to use.
        eps: sink thresholds in (0, 1).
        sink_tokens: T of the sink metric (64; capped at ``context``).
        packer: the held-out stream's packer (``batch(step, batch_size, seed)``), or None to
            skip the training-format loss.
        n_windows, window_seed: the training-format windows, ``packer.batch(0, n_windows, window_seed)``.
        keep_first: the windows' key 0 (a fixed ⟨bos⟩) stays visible under intra-document masking.
        batch_bytes: cap on one forward call's capture buffers.

    Returns:
        ``{"n_docs", "n_targets", "sink_tokens", "eps", "val_loss": {"bos", "text"} (nats),
        "sink_rate": {"bos": {"0.3", "0.8"}, "text": {...}} (fractions in [0, 1]),
        "importance": {"bos", "text"} ((N, L, H) float64 a_0), "val_loss_train" (nats, or None
        without a packer), "n_train_targets"}``.
    """
    docs = eval_documents(documents, n_docs)
    eps = [check_eps(e) for e in eps]
    T = min(int(sink_tokens), int(context))
    out: Dict[str, Any] = {"n_docs": len(docs), "sink_tokens": T, "eps": [float(e) for e in eps],
                           "val_loss": {}, "sink_rate": {}, "importance": {}}
    for mode in MODES:
        total, count = doc_loss(model, docs, context, bos_id, mode, batch_bytes, progress)
        out["val_loss"][mode] = total / count
        out["n_targets"] = count
        imp = sink_importance(model, docs, T, bos_id, mode, batch_bytes, progress)
        out["importance"][mode] = imp
        out["sink_rate"][mode] = {f"{e:g}": sink_rate_of(imp, e) for e in eps}
    out["val_loss_train"], out["n_train_targets"] = None, 0
    if packer is not None:
        total, count = packed_loss(model, packer, n_windows, window_seed, keep_first)
        out["val_loss_train"] = total / count if count else None
        out["n_train_targets"] = count
    return out
