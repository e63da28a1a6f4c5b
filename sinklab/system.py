"""Ground-floor system helpers: memory, atomic writes, stale temporaries.

Imports nothing of sinklab, so every floor above (io, model, sweeps, train) may use it. The
temporaries written here are named ``<name>.tmp-<pid>-<random>``; :func:`clean_stale` removes
those whose process no longer runs.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid
from typing import IO, Callable, List, Optional, Union

MEMINFO = "/proc/meminfo"  # a module attribute so tests can point it elsewhere
TMP_PATTERN = re.compile(r"\.tmp-(\d+)")
"""The ``.tmp-<pid>`` part of a temporary's name: the writer's process id."""


def available_memory() -> Optional[int]:
    """Bytes of memory available for new allocations, or None when it cannot be told.

    psutil's ``virtual_memory().available`` when psutil is installed (it is only a test
    dependency), else Linux's ``MemAvailable`` from /proc/meminfo; None elsewhere, and then no
    size check is made.
    """
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return int(psutil.virtual_memory().available)
        except Exception:  # psutil without support for this platform: fall back
            pass
    try:
        with open(MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    return None


def fsync_dir(folder: Union[str, os.PathLike]) -> None:
    """Makes a rename in ``folder`` durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Union[str, os.PathLike], write: Callable[[IO[bytes]], object]) -> str:
    """Calls ``write(f)`` on a temporary file beside ``path``, fsyncs it and renames it to
    ``path`` (then fsyncs the folder); on any error (a full disk, Ctrl-C) the temporary file is
    removed and ``path`` is left as it was, so no reader ever sees a half-written file.

    The temporary name is ``<path>.tmp-<pid>-<random>``: unique per call (two threads may write
    the same path), and a process killed mid-write (no ``finally`` runs) leaves a name
    :func:`clean_stale` recognises by its ``.tmp-<pid>`` part. Returns ``path``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_dir(os.path.dirname(os.path.abspath(path)))
    return path


def write_text_atomic(path: Union[str, os.PathLike], text: str) -> str:
    """``text`` (UTF-8) written to ``path`` through :func:`write_atomic`; returns ``path``."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda f: f.write(data))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host. This process counts as not running: a
    temporary of ours found by a cleaner is one a failed write left (no write runs then)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def clean_stale(folder: Union[str, os.PathLike]) -> List[str]:
    """Removes the ``*.tmp-<pid>*`` files and folders left in ``folder`` by processes that no
    longer run (a write or delete that was killed); returns their paths."""
    folder = os.fspath(folder)
    removed: List[str] = []
    if not os.path.isdir(folder):
        return removed
    for name in os.listdir(folder):
        m = TMP_PATTERN.search(name)
        if not m or pid_alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        removed.append(path)
    return removed
