"""Hugging Face Hub names: ``sl.load("HuggingFaceTB/SmolLM2-135M-Instruct")``.

A repo id is resolved through ``huggingface_hub`` into its local cache (the layout every
Hugging Face library shares: ``$HF_HUB_CACHE``, default ``$HF_HOME/hub``, default
``~/.cache/huggingface/hub``), downloading what is missing with its progress bars unless the hub
is off (``HF_HUB_OFFLINE=1``, then only the cache is read). A safetensors repo comes as a folder
of the files sinklab reads (config, weights, tokenizer); a GGUF repo as the one file named by
``filename=``. Models are named by their repo id, also when loaded from a path inside the cache.
The environment is read at each call, so setting ``HF_HOME`` or ``HF_HUB_OFFLINE`` in a running
notebook takes effect. ``HF_ENDPOINT`` points at a mirror.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

# what sinklab reads from a safetensors repo (nothing else is downloaded)
FOLDER_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CACHED = re.compile(r"models--(?P<org>[^/\\]+?)--(?P<name>[^/\\]+)[/\\]snapshots[/\\][0-9a-f]{40}")


def is_repo_id(name: str) -> bool:
    """Whether ``name`` reads as ``org/name`` (and is not a path that exists)."""
    return bool(_REPO_ID.match(name)) and not os.path.exists(name) and not name.endswith((".gguf", ".json"))


def repo_id_of_path(path: str) -> Optional[str]:
    """``org/name`` when ``path`` lies in a hub cache snapshot (``models--org--name/snapshots/<sha>/``),
    else None."""
    hit = _CACHED.search(os.path.abspath(path))
    return f"{hit.group('org')}/{hit.group('name')}" if hit else None


def cache_dir() -> str:
    """The hub cache as the environment says now: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(repo_id: str, revision: Optional[str] = None, filename: Optional[str] = None,
            quiet: bool = False) -> Path:
    """The local path of ``repo_id`` at ``revision`` (default: the repo's main branch): the file
    ``filename`` (a GGUF repo), or a folder with the safetensors model's files.

    Raises:
        FileNotFoundError: the repo, revision or file is not on the hub (or, offline, not in the
            cache); a GGUF repo without ``filename`` (the message lists its .gguf files).
        ImportError: huggingface_hub is missing.
    """
    try:
        import huggingface_hub as hh
        from huggingface_hub import errors
    except ImportError:
        raise ImportError("loading a Hugging Face repo id needs huggingface_hub: pip install huggingface_hub") \
            from None
    where = f"{repo_id}{'@' + revision if revision else ''}"
    kw: Dict[str, Any] = dict(repo_id=repo_id, revision=revision, cache_dir=cache_dir(),
                              local_files_only=offline(), endpoint=os.environ.get("HF_ENDPOINT") or None)
    silence = quiet and not hh.utils.are_progress_bars_disabled()    # the user's own setting is kept
    if silence:
        hh.utils.disable_progress_bars()
    try:
        if filename is not None:
            return Path(str(hh.hf_hub_download(filename=filename, **kw)))
        folder = Path(str(hh.snapshot_download(allow_patterns=FOLDER_FILES, **kw)))
    except errors.RevisionNotFoundError:
        raise FileNotFoundError(f"{where}: no such revision on the hub") from None
    except errors.LocalEntryNotFoundError:     # (a subclass of EntryNotFoundError: first)
        raise FileNotFoundError(f"{where}{' ' + filename if filename else ''} is not in the Hugging Face cache "
                                f"{cache_dir()}, and the hub is {'off (HF_HUB_OFFLINE)' if offline() else 'unreachable'}"
                                f": connect once, or pass a local path") from None
    except errors.EntryNotFoundError:
        raise FileNotFoundError(f"{where}: the repo has no file {filename!r}") from None
    except errors.RepositoryNotFoundError:
        raise FileNotFoundError(f"{where}: no such model repo on the hub (or it is private: log in with "
                                f"`huggingface-cli login`)") from None
    finally:
        if silence:
            hh.utils.enable_progress_bars()
    if not (folder / "config.json").is_file():
        ggufs = _gguf_files(hh, folder, kw)
        if ggufs:
            raise FileNotFoundError(f"{where} is a GGUF repo: pass filename= one of {', '.join(ggufs)}")
        raise FileNotFoundError(f"{where} has neither config.json nor .gguf files: not a model sinklab reads")
    return folder


def _gguf_files(hh: Any, folder: Path, kw: Dict[str, Any]) -> List[str]:
    """The repo's .gguf files: from the hub, or offline from what the cached snapshot holds."""
    if kw["local_files_only"]:
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.gguf"))
    try:
        files = hh.HfApi(endpoint=kw["endpoint"]).list_repo_files(kw["repo_id"], revision=kw["revision"])
    except Exception:                       # listing is a courtesy: the error above stands without it
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.gguf"))
    return sorted(f for f in files if f.endswith(".gguf"))


__all__ = ["resolve", "is_repo_id", "repo_id_of_path", "cache_dir", "offline", "FOLDER_FILES"]
