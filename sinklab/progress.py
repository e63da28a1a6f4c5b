"""The one progress bar helper: tqdm (``tqdm.auto``: a widget in Jupyter, text elsewhere), shown
only when ``progress`` is true, always labelled with what runs."""
from __future__ import annotations

from typing import Any, Iterable, Optional


def progress_bar(iterable: Optional[Iterable[Any]] = None, progress: bool = True, desc: str = "",
                 total: Optional[int] = None, unit: str = "it", **kw: Any) -> Any:
    """A tqdm bar over ``iterable`` (or a manual bar of ``total`` steps, ``.update(n)``).

    Args:
        iterable: what to iterate over; None for a manual bar.
        progress: show the bar; when false the bar is disabled and iterates silently.
        desc: what runs, shown before the bar (e.g. ``"perplexity (BOS)"``).
        total: number of steps, when ``iterable`` has no ``len``.
        unit: what one step is (``"prompt"``, ``"seq"``, ...).
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc or None, unit=unit, disable=not progress, **kw)
