"""The one progress bar helper: tqdm (``tqdm.auto``: a widget in Jupyter, text elsewhere), shown
only when ``progress`` is true, always labelled with what runs. A bar that is not shown is a
:class:`SilentBar`, so that quiet calls (every call with ``progress=False``, a sweep's workers)
never import tqdm: its import (asyncio included, ~0.1 s) would otherwise run inside the first
long C call of a process, where a Ctrl-C landing mid-import leaves Python's import machinery with
a half-initialized module (seen as a NameError from inside ``asyncio``) instead of a clean
KeyboardInterrupt."""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional


class SilentBar:
    """The part of tqdm's interface sinklab uses, doing nothing but counting (``n``, ``total``)."""

    def __init__(self, iterable: Optional[Iterable[Any]] = None, total: Optional[int] = None) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.n: float = 0

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("a manual progress bar (iterable=None) is not iterable")
        for x in self.iterable:
            yield x
            self.n += 1

    def __len__(self) -> int:
        return 0 if self.total is None else int(self.total)

    def __enter__(self) -> "SilentBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def set_description(self, desc: Optional[str] = None, refresh: bool = True) -> None:
        pass

    def refresh(self) -> None:
        pass


def progress_bar(iterable: Optional[Iterable[Any]] = None, progress: bool = True, desc: str = "",
                 total: Optional[int] = None, unit: str = "it", **kw: Any) -> Any:
    """A tqdm bar over ``iterable`` (or a manual bar of ``total`` steps, ``.update(n)``).

    Args:
        iterable: what to iterate over; None for a manual bar.
        progress: show the bar; when false a :class:`SilentBar` iterates silently (tqdm is not
            imported).
        desc: what runs, shown before the bar (e.g. ``"perplexity (BOS)"``).
        total: number of steps, when ``iterable`` has no ``len``.
        unit: what one step is (``"prompt"``, ``"seq"``, ...).
    """
    if not progress:
        return SilentBar(iterable, total)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc or None, unit=unit, **kw)
