"""SentencePiece-style BPE from GGUF metadata (``tokenizer.ggml.model == "llama"``): ``▁`` for
spaces, best-score-first merges (rebuilt from ``tokenizer.ggml.scores`` when the file has none),
``<0xNN>`` byte fallback."""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .bpe import split_merges, valid_merges


def _merges_from_scores(tokens: Sequence[str], scores: np.ndarray, vocab: Dict[str, int]) -> List[Tuple[str, str]]:
    """BPE merges equivalent to SentencePiece/llama.cpp's score-driven pair merging.

    llama.cpp merges, at each step, the adjacent pair whose concatenation is the vocabulary token
    with the highest score. As BPE merges: every split ``(l, r)`` of every token with both halves
    in the vocabulary, ranked by the token's score, best first. Ties are broken as
    ``transformers.tokenization_utils_base.generate_merges`` does (longer left part first, then
    longer right part, then token id / part ids), so that both give identical merge tables.
    """
    entries = []
    for tok_id, tok in enumerate(tokens):
        if vocab.get(tok) != tok_id:  # a duplicate string: only its last id is reachable
            continue
        score = float(scores[tok_id])
        local = []
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right))
        local.sort()
        for _, _, left, right in local:
            entries.append((score, len(left), len(right), left, right))
    # Python's sort is stable, also with reverse=True: equal keys keep token order.
    entries.sort(key=lambda t: (t[0], t[1], t[2]), reverse=True)
    return [(left, right) for _, _, _, left, right in entries]



def build_llama(meta: Dict[str, Any], tokens: List[str], types: np.ndarray):
    from tokenizers import Tokenizer as _Backend
    from tokenizers import decoders, models, normalizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if meta.get("tokenizer.ggml.merges"):
        merges = valid_merges(split_merges(meta["tokenizer.ggml.merges"]), vocab)
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None:
            raise ValueError("GGUF tokenizer model 'llama' has neither tokenizer.ggml.scores nor merges")
        scores = np.asarray(scores, dtype=np.float32)
        if scores.shape != (len(tokens),):
            raise ValueError(f"tokenizer.ggml.scores has {scores.size} entries for {len(tokens)} tokens")
        merges = _merges_from_scores(tokens, scores, vocab)

    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = _Backend(
        models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    # llama.cpp: every stretch of raw text (the start, and whatever follows a special or
    # user-defined token) gets " " prepended when add_space_prefix is set, then every space
    # becomes "▁". As normalizers, these run on exactly those stretches, since added tokens are
    # cut out of the text first. (A Metaspace pre-tokenizer would not prepend to text that
    # already starts with a space, nor after a special token.)
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps_n = [normalizers.Prepend("▁")] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence(steps_n + [normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend, True  # llama.cpp adds BOS to SentencePiece vocabularies unless told not to

