"""Runs many prompts through :meth:`sinklab.Model.run` in batches, one result per prompt.

Analyses that loop over prompts (sink studies, perplexity, passkey, perturbation, no-op heads)
call :func:`run_each` instead of ``model.run`` once per prompt. It groups the sequences that
can share a forward call — the same length T (and the same ``logits_from``) — into (B, T)
batches, keeping each group in the order its first member appears, and yields
``(index, trace)`` for every prompt, where ``trace`` holds exactly what ``model.run(seqs[index],
...)`` would return for that prompt alone: batched rows are bitwise equal to per-sequence runs
(each output element is computed by the same fixed chain of float32 operations whatever the
batch), so an analysis gives the same bits batched or not.

**Memory cap.** A batch holds at most as many sequences as fit in ``batch_bytes`` bytes of
capture buffers, counted with :meth:`sinklab.Model.capture_bytes` (e.g. full attention of
SmolLM2-135M at T = 64 is 4.4 MB a sequence, so 57 sequences a batch under the default); a
sequence larger than the cap on its own still runs, alone. The default is
:data:`BATCH_BYTES` (256 MiB), read at call time, so ``sinklab.batching.BATCH_BYTES = ...``
changes it for every analysis; each analysis also takes a ``batch_bytes=`` argument.

**Unequal lengths** (``ragged=True``, when ``Model.run`` takes ``lengths=``): sequences of any
length share a call as a zero-padded (B, T_max) batch with explicit lengths, longest first, and
each row is cut back to its own length (and copied, so it is contiguous like a single run's).
Used where prompt lengths vary (perplexity over texts, no-op heads); results are the same bits.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .progress import progress_bar
from .trace import CAPTURES, STATS, TOKEN_AXES, AttentionStats, Trace, buffer_axes

#: Default cap, in bytes, on the capture buffers of one batched ``model.run`` call (256 MiB).
BATCH_BYTES = 256 * 2**20


def _cap(batch_bytes: Optional[int]) -> int:
    cap = BATCH_BYTES if batch_bytes is None else batch_bytes
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
        raise ValueError(f"batch_bytes must be a positive integer number of bytes, got {batch_bytes!r}")
    return int(cap)


def max_batch(model: Any, T: int, capture: Union[str, Iterable[str]], layers: Optional[Sequence[int]] = None,
              logits_from: int = 0, batch_bytes: Optional[int] = None, logit_rows: Optional[int] = None) -> int:
    """The most sequences of ``T`` tokens whose capture buffers fit in ``batch_bytes`` (>= 1).

    Bytes per sequence are ``sum(model.capture_bytes(T, capture, layers, logits_from, B=1, logit_rows))``
    (``logit_rows``: the ``logits_at`` positions per sequence, if any); ``batch_bytes`` defaults to
    :data:`BATCH_BYTES`.
    """
    per = sum(model.capture_bytes(T, capture, layers, logits_from, B=1, logit_rows=logit_rows).values())
    return max(1, _cap(batch_bytes) // max(per, 1))


def plan(lengths: Sequence[int], limit: Any, keys: Optional[Sequence[Any]] = None) -> List[List[int]]:
    """Batches of indices: equal ``(lengths[i], keys[i])`` grouped, each group cut into chunks of
    at most ``limit(T, key)`` indices.

    Groups come in the order of their first member, indices inside a group in increasing order,
    so a list of equal-length prompts gives ``[[0, 1, ..], [k, k+1, ..], ..]``.
    """
    groups: Dict[Tuple[int, Any], List[int]] = {}
    for i, T in enumerate(lengths):
        groups.setdefault((int(T), None if keys is None else keys[i]), []).append(i)
    out = []
    for (T, key), idx in groups.items():
        n = max(1, int(limit(T, key)))
        out.extend(idx[k:k + n] for k in range(0, len(idx), n))
    return out


def _ragged_plan(lengths: Sequence[int], per_seq: Any, cap: int) -> List[List[int]]:
    """Indices sorted longest first (ties in index order), cut into batches whose padded capture
    buffers, ``len(batch) * per_seq(T_max of the batch)`` bytes, stay under ``cap`` (>= 1 each)."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    out: List[List[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * per_seq(int(lengths[out[-1][0]])) <= cap:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _cut(a: np.ndarray, buffer: str, n: int, n_logits: int) -> np.ndarray:
    """A contiguous copy of one row's ``buffer`` cut to ``n`` tokens along its token axes
    (:data:`sinklab.trace.BUFFERS`; the logits axis to ``n_logits`` rows)."""
    idx = tuple(slice(0, n_logits) if ax == "logit_pos" else slice(0, n) if ax in TOKEN_AXES
                else slice(None) for ax in buffer_axes(buffer))
    return np.ascontiguousarray(a[idx])


def _cut_row(tr: Trace, n: int, n_logits: int) -> Trace:
    """A (T_max,)-padded row trace cut to its real length ``n`` and ``n_logits`` logits rows
    (contiguous copies)."""
    for name in ("ids",) + tuple(c for c in CAPTURES if c != "stats"):
        v = getattr(tr, name)
        if v is not None:
            setattr(tr, name, _cut(v, name, n, n_logits))
    if tr.stats is not None:
        tr.stats = AttentionStats(*(_cut(getattr(tr.stats, k), k, n, n_logits) for k in STATS))
    return tr


def _positions(arrs: List[np.ndarray], logits_at: Any, logits_from: Any) -> Optional[List[np.ndarray]]:
    """``logits_at`` per sequence as (R_i,) int64 positions in [0, len_i), or None when absent;
    ValueError naming the sequence and position otherwise."""
    if logits_at is None:
        return None
    if np.ndim(logits_from) != 0 or int(logits_from) != 0:
        raise ValueError("logits_at and logits_from are exclusive: give one")
    if len(logits_at) != len(arrs):
        raise ValueError(f"logits_at has {len(logits_at)} entries for {len(arrs)} sequences")
    out = []
    for i, (a, p) in enumerate(zip(arrs, logits_at)):
        p = np.asarray(p)
        if p.ndim != 1 or p.size == 0 or not np.issubdtype(p.dtype, np.integer):
            raise ValueError(f"logits_at[{i}] must be a non-empty 1-D array of integer positions, got {p.dtype} {p.shape}")
        bad = np.flatnonzero((p < -len(a)) | (p >= len(a)))
        if bad.size:
            raise ValueError(f"logits_at[{i}] has position {int(p[bad[0]])} outside [-{len(a)}, {len(a)}) "
                             f"for sequence {i} of {len(a)} tokens")
        out.append(p.astype(np.int64) % len(a))
    return out


def _rows_at(at: List[np.ndarray], idx: List[int]) -> np.ndarray:
    """(len(idx), R_max) positions of a batch: each sequence's own, padded by repeating its last
    (the padded rows are computed and cut off)."""
    R = max(len(at[i]) for i in idx)
    return np.stack([np.concatenate([at[i], np.full(R - len(at[i]), at[i][-1], np.int64)]) for i in idx])


def _takes_lengths(model: Any) -> bool:
    try:
        return "lengths" in inspect.signature(model.run).parameters
    except (TypeError, ValueError):
        return False


def _row(tr: Trace, b: int) -> Trace:
    """Batch row ``b`` of a batched trace, as the (T,)-ids trace of that sequence (views)."""
    fields = {}
    for f in dataclasses.fields(Trace):
        v = getattr(tr, f.name)
        if f.name == "lengths":          # padding lengths: run_each batches equal lengths only
            v = None
        elif isinstance(v, np.ndarray):
            v = v[b]
        elif isinstance(v, AttentionStats):
            v = AttentionStats(v.importance[b], v.to_first[b], v.entropy[b])
        fields[f.name] = v
    meta = dict(tr.meta)
    bos = meta.get("bos_token_id")
    meta["starts_with_bos"] = bool(bos is not None and int(tr.ids[b, 0]) == bos)
    fields["meta"], fields["layers"] = meta, list(tr.layers)
    return Trace(**fields)


def run_each(model: Any, seqs: Sequence[Any], capture: Union[str, Iterable[str]],
             layers: Optional[Sequence[int]] = None,
             logits_from: Union[int, Sequence[int]] = 0, intervene: Any = None,
             batch_bytes: Optional[int] = None, progress: bool = True, desc: str = "forward",
             unit: str = "prompt", ragged: bool = False,
             logits_at: Optional[Sequence[Any]] = None) -> Iterator[Tuple[int, Trace]]:
    """Yields ``(i, trace_i)`` for every sequence ``seqs[i]``, running equal-length sequences
    together as (B, T) batches under the memory cap.

    Args:
        model: a :class:`sinklab.Model`.
        seqs: token-id sequences (each (T_i,) integers, as ``model.run`` takes them; the BOS,
            if wanted, already in place).
        capture, layers, intervene: as for :meth:`sinklab.Model.run`, the same for every sequence.
        logits_from: one value for all, or one per sequence (negative counts from that
            sequence's end); sequences are batched only with others of the same length and the
            same resolved ``logits_from``.
        batch_bytes: cap on one call's capture buffers in bytes (default :data:`BATCH_BYTES`).
        progress: one tqdm bar over the sequences, advanced per batch.
        desc, unit: the bar's label and unit.
        ragged: let sequences of different lengths share a call, zero-padded with explicit
            ``lengths=`` (see the module docstring); needs one ``logits_from`` >= 0 for all
            and a ``Model.run`` that takes ``lengths=`` (else equal lengths only, as without).
        logits_at: None, or one (R_i,) array of positions per sequence (negative counts from
            its end), as ``Model.run``'s ``logits_at``: the trace's logits are (R_i, V), only
            those rows computed; sequences with different R_i still share a call. Exclusive
            with ``logits_from``.

    Yields:
        ``(i, trace)`` in batch order (not necessarily increasing ``i``): ``trace`` is what
        ``model.run(seqs[i], capture=capture, ...)`` returns, shapes without a batch axis, its
        arrays views into the batch's buffers (bitwise equal to that run's).
    """
    arrs = [np.asarray(s) for s in seqs]
    for i, a in enumerate(arrs):
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"sequence {i} must be a non-empty 1-D array of token ids, got shape {a.shape}")
    n = len(arrs)
    lf = [int(logits_from)] * n if np.ndim(logits_from) == 0 else [int(x) for x in logits_from]
    if len(lf) != n:
        raise ValueError(f"logits_from has {len(lf)} entries for {n} sequences")
    for i, (a, x) in enumerate(zip(arrs, lf)):
        if not -len(a) <= x < len(a):
            raise ValueError(f"logits_from={x} outside [-{len(a)}, {len(a)}) for sequence {i} of {len(a)} tokens")
    lf = [x % len(a) for a, x in zip(arrs, lf)]
    at = _positions(arrs, logits_at, logits_from)
    rows = None if at is None else max(len(p) for p in at)     # the memory plan's (most) logits rows
    cap = _cap(batch_bytes)
    # padding needs every row's logits to start at the same position, counted from the start
    pad = ragged and np.ndim(logits_from) == 0 and int(logits_from) >= 0 and _takes_lengths(model)
    if pad:
        lf0 = int(logits_from)
        batches = _ragged_plan([len(a) for a in arrs], lambda T: sum(
            model.capture_bytes(T, capture, layers, lf0, B=1, logit_rows=rows).values()), cap)
    else:
        batches = plan([len(a) for a in arrs],
                       lambda T, key: max_batch(model, T, capture, layers, key, cap, rows), keys=lf)
    bar = progress_bar(None, progress and n > 0, desc=desc, total=n, unit=unit)
    try:
        for idx in batches:
            lens = [len(arrs[i]) for i in idx]
            kw = {}
            if pad and min(lens) < max(lens):
                ids = np.zeros((len(idx), max(lens)), np.int64)   # padding ids are never read
                for b, i in enumerate(idx):
                    ids[b, :lens[b]] = arrs[i]
                kw["lengths"] = np.asarray(lens, np.int64)
            else:
                ids = np.stack([arrs[i] for i in idx])
            if at is not None:
                kw["logits_at"] = _rows_at(at, idx)
            tr = model.run(ids, capture=capture, layers=layers, intervene=intervene,
                           logits_from=lf[idx[0]], progress=False, **kw)
            for b, i in enumerate(idx):
                row = _row(tr, b)
                n_logits = lens[b] - lf[i] if at is None else len(at[i])
                if "lengths" in kw or (at is not None and n_logits < kw["logits_at"].shape[1]):
                    row = _cut_row(row, lens[b], n_logits)
                if at is not None:
                    row.meta["logits_at"] = at[i].tolist()
                yield i, row
            bar.update(len(idx))
    finally:
        bar.close()


def run_all(model: Any, seqs: Sequence[Any], capture: Union[str, Iterable[str]], **kw: Any) -> List[Trace]:
    """:func:`run_each`, collected: the list of per-sequence traces in the order of ``seqs``.

    Every trace keeps its batch's buffers alive; prefer :func:`run_each` and keep only what is
    needed when the captures are large.
    """
    out: List[Optional[Trace]] = [None] * len(seqs)
    for i, tr in run_each(model, seqs, capture, **kw):
        out[i] = tr
    return out  # type: ignore[return-value]
