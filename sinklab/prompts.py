"""The prompt set shipped with sinklab: 180 English prose passages (public domain).

``sinklab/data/passages.txt`` holds one passage per line (UTF-8, plain ASCII in practice): full
paragraphs of Jane Austen's six novels, 120-220 SmolLM2 tokens each (without BOS), 30 per novel
taken evenly through each book, interleaved novel by novel (line i comes from novel i mod 6).
``data/PASSAGES_SOURCE.md`` gives the source, the licence and the extraction.

Splits (disjoint, fixed):
  * ``"sinks"``: the first 80 % of the lines (144 passages) -- for sink metrics and other analyses;
  * ``"heldout"``: the last 20 % (36 passages, 6 from each novel) -- for perplexity, so that
    quality numbers are never measured on passages used to choose or inspect anything else;
  * ``"all"``: every passage, in file order.
"""
from __future__ import annotations

from importlib import resources
from typing import List

SPLITS = ("all", "sinks", "heldout")
HELDOUT_FRACTION = 0.2
PASSAGES_FILE = "data/passages.txt"


def _read_all() -> List[str]:
    text = resources.files("sinklab").joinpath(PASSAGES_FILE).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def n_heldout(n_total: int) -> int:
    """Size of the held-out split for ``n_total`` passages: round(20 %), at least 1."""
    return max(1, int(round(HELDOUT_FRACTION * n_total)))


def load_passages(split: str = "all") -> List[str]:
    """The shipped passages of one split, in file order.

    Args:
        split: ``"all"`` (180), ``"sinks"`` (first 144) or ``"heldout"`` (last 36).

    Returns:
        A list of passages (str), each one paragraph without line breaks.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    lines = _read_all()
    cut = len(lines) - n_heldout(len(lines))
    if split == "sinks":
        return lines[:cut]
    if split == "heldout":
        return lines[cut:]
    return lines
