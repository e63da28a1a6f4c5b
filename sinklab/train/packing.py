"""Packing a token stream into training windows, the paper's strategies (§7, Table 2).

The stream is the documents one after another, each followed by ``<eos>`` (what
:mod:`sinklab.train.corpus` writes). It is cut into consecutive, non-overlapping windows of
``S`` text tokens; every window is an input of length ``C`` (the context):

* **fixed ⟨bos⟩ off**: ``S = C``; the window is ``stream[w*S : w*S + C]``;
* **fixed ⟨bos⟩ on**: ``S = C - 1``; the window is ``<bos>`` followed by ``stream[w*S : w*S + S]``,
  so the same token sits at position 0 of every window whatever document the window starts in.

Targets are the next token of each position (with ⟨bos⟩, position 0 predicts ``stream[w*S]``), so
the window needs one token of the stream after it; windows that lack it are not formed.

Attention is either **causal** over the whole window (documents see the documents before them in
the window) or **intra-document**: position ``i`` sees only keys ``j`` in ``[key_start[i], i]``
where ``key_start[i]`` is the window position where ``i``'s document begins (its ``<eos>`` belongs
to the document it ends; a document begun before the window starts at the window's first text
position, 0, or 1 after a fixed ⟨bos⟩), plus key 0 when the fixed ⟨bos⟩ is on (the attention
kernel adds that key; :class:`Packer` only gives ``key_start``, and ``key_start = 0`` for the
⟨bos⟩ itself).

**Order and resume.** Global window index ``g = step * B + b`` (B the batch size) is read in
epoch ``e = g // n_windows`` at place ``g % n_windows`` of the permutation
``numpy.random.default_rng([seed, e]).permutation(n_windows)``. A batch is therefore a pure
function of ``(seed, step)`` (and the stream): a run resumed at step ``k`` reads exactly the
batches the uninterrupted run would have read, with no data-loader state to save but the step.

**Equal tokens per step across contexts** (Fig. 5): every window holds ``C`` input positions (the
⟨bos⟩ included) and ``C`` targets, so a step of ``B`` windows is ``B * C`` tokens
(:func:`tokens_per_step`); training contexts ``C`` with ``B = tokens_per_step // C``
(:func:`batch_size_for`) keeps the tokens per step, and so the tokens seen after each step,
equal across contexts.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np


def tokens_per_step(context: int, batch_size: int) -> int:
    """Input positions (= predicted tokens) of one optimizer step: ``context * batch_size``."""
    if context < 2 or batch_size < 1:
        raise ValueError(f"context={context} (need >= 2), batch_size={batch_size} (need >= 1)")
    return int(context) * int(batch_size)


def batch_size_for(context: int, step_tokens: int) -> int:
    """The batch size that gives ``step_tokens`` tokens per step at ``context``:
    ``step_tokens // context``, which must divide exactly (so every context sees the same
    tokens per step)."""
    if context < 2 or step_tokens < context or step_tokens % context:
        raise ValueError(f"tokens per step {step_tokens} is not a positive multiple of context {context}")
    return step_tokens // context


class Packer:
    """Windows of a document stream for training at one context length and packing strategy.

    Args:
        tokens: (N,) integer stream (np.memmap or array): documents each followed by <eos>.
        doc_offsets: int (n_docs + 1,): document k = ``tokens[off[k]:off[k+1]]``; ``off[0] = 0``,
            ``off[-1] = N``, strictly increasing.
        context: C, the window length the model sees (input positions), >= 2.
        fixed_bos: put ``bos_id`` at position 0 of every window (S = C - 1 text tokens).
        bos_id: the ⟨bos⟩ token id.
        intra_doc: give ``key_start`` for intra-document attention (else it is None: causal
            attention over the whole window).
    """

    def __init__(self, tokens: np.ndarray, doc_offsets: np.ndarray, context: int, fixed_bos: bool,
                 bos_id: int, intra_doc: bool):
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        offsets = np.asarray(doc_offsets, dtype=np.int64)
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if offsets.ndim != 1 or len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != len(tokens) \
                or np.any(np.diff(offsets) <= 0):
            raise ValueError("doc_offsets must be strictly increasing from 0 to len(tokens) "
                             f"(got {len(offsets)} offsets for {len(tokens)} tokens)")
        if int(context) != context or context < 2:
            raise ValueError(f"context={context!r}: need an integer >= 2")
        self.tokens = tokens
        self.doc_offsets = offsets
        self.context = int(context)
        self.fixed_bos = bool(fixed_bos)
        self.bos_id = int(bos_id)
        self.intra_doc = bool(intra_doc)
        self.first_text = 1 if self.fixed_bos else 0   # window position of the first stream token
        self.stride = self.context - self.first_text   # S: stream tokens per window
        self._perms: Dict[Tuple[int, int], np.ndarray] = {}
        if self.n_windows < 1:
            raise ValueError(f"a stream of {len(tokens)} tokens holds no window of {self.stride} text tokens "
                             f"plus one target")

    @property
    def n_windows(self) -> int:
        """Windows in one epoch: the largest n with n*S + 1 <= N (the last target exists)."""
        return (len(self.tokens) - 1) // self.stride

    @property
    def tokens_per_epoch(self) -> int:
        """Input positions of one epoch, ``n_windows * C``."""
        return self.n_windows * self.context

    def window(self, w: int) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """Window ``w``: ``ids`` (C,) int64, ``targets`` (C,) int64 (the next token of each
        position) and ``key_start`` (C,) int64 when ``intra_doc`` (else None)."""
        if not 0 <= w < self.n_windows:
            raise IndexError(f"window {w} out of range [0, {self.n_windows})")
        S, a = self.stride, w * self.stride
        text = np.asarray(self.tokens[a:a + S + 1], dtype=np.int64)   # S inputs and one more
        if self.fixed_bos:
            ids = np.concatenate([np.array([self.bos_id], dtype=np.int64), text[:S]])
            targets = text
        else:
            ids, targets = text[:S], text[1:]
        return ids, targets, (self._key_start(a) if self.intra_doc else None)

    def _key_start(self, a: int) -> np.ndarray:
        """Window position where each position's document begins (stream start ``a``)."""
        t = a + np.arange(self.stride, dtype=np.int64)
        doc = np.searchsorted(self.doc_offsets, t, side="right") - 1
        start = np.maximum(self.doc_offsets[doc] - a, 0) + self.first_text
        if self.fixed_bos:
            start = np.concatenate([np.zeros(1, dtype=np.int64), start])
        return start

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The windows of ``epoch`` in reading order: ``default_rng([seed, epoch]).permutation``."""
        key = (int(seed), int(epoch))
        perm = self._perms.get(key)
        if perm is None:
            if len(self._perms) > 4:   # a run reads epochs in order: keep a few
                self._perms.clear()
            perm = np.random.default_rng([int(seed), int(epoch)]).permutation(self.n_windows)
            self._perms[key] = perm
        return perm

    def batch_windows(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        """Window indices (B,) of batch ``step``: global index g = step*B + b, read in epoch
        g // n_windows at place g % n_windows of :meth:`epoch_order`."""
        if step < 0 or batch_size < 1:
            raise ValueError(f"step={step} (need >= 0), batch_size={batch_size} (need >= 1)")
        g = int(step) * int(batch_size) + np.arange(batch_size, dtype=np.int64)
        n = self.n_windows
        return np.array([self.epoch_order(seed, int(e))[int(i)] for e, i in zip(g // n, g % n)], dtype=np.int64)

    def batch(self, step: int, batch_size: int, seed: int
              ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
        """Batch ``step``: ``ids`` (B, C) int64, ``targets`` (B, C) int64, ``key_start`` (B, C)
        int64 or None; a pure function of ``(seed, step, batch_size)`` (resume-safe)."""
        ws = [self.window(int(w)) for w in self.batch_windows(step, batch_size, seed)]
        ids = np.stack([x[0] for x in ws])
        targets = np.stack([x[1] for x in ws])
        key_start = np.stack([ks for _, _, ks in ws if ks is not None]) if self.intra_doc else None
        return ids, targets, key_start

    def __repr__(self) -> str:
        return (f"Packer(C={self.context}, fixed_bos={self.fixed_bos}, intra_doc={self.intra_doc}, "
                f"{self.n_windows:,} windows of {self.stride} stream tokens)")


__all__ = ["Packer", "batch_size_for", "tokens_per_step"]
