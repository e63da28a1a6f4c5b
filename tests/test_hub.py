"""Hugging Face repo ids in sl.load, through huggingface_hub's cache: offline against a cache in
the hub's own layout built here from local files (blobs, snapshots, refs), and online against a
stand-in for the hub served on 127.0.0.1 (HF_ENDPOINT). Numbers are checked against
transformers on the same weights."""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import sinklab as sl
from tests.support.reference_models import SPECS, hf_forward, make_hf_model, save_hf

pytest.importorskip("huggingface_hub")
REPO = "test-org/tiny-llama"
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = make_hf_model(SPECS["mha"])
    return hf, save_hf(hf, tmp_path_factory.mktemp("hub") / "tiny")


def hub_cache(root, repo, files, sha=SHA, ref="main"):
    """A cache as huggingface_hub lays it out: blobs named by content hash, a snapshot of
    symlinks to them, and refs/<ref> holding the commit."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / sha
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        data = src.read_bytes()
        blob = base / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snap / rel).parent), snap / rel)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / ref).write_text(sha)
    return snap


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_repo_id_from_the_offline_cache(tiny, offline):
    hf, folder = tiny
    snap = hub_cache(offline, REPO, {p.name: p for p in folder.iterdir()})
    m = sl.load(REPO)
    assert m.name == REPO and os.path.realpath(m.source) == os.path.realpath(snap)
    ids = np.array([1, 5, 9, 2, 7, 3])
    ref = hf_forward(hf, ids)["logits"]
    assert np.abs(m.run(ids, capture="logits").logits - ref).max() < 1e-4 * np.abs(ref).max()
    assert sl.load(REPO, revision="main").name == REPO
    # a snapshot path names the model by its repo id, not by the commit hash
    assert sl.load(snap).name == REPO


def test_offline_misses_are_clear(tiny, offline):
    _, folder = tiny
    hub_cache(offline, REPO, {p.name: p for p in folder.iterdir()})
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache.*HF_HUB_OFFLINE"):
        sl.load("test-org/absent")
    with pytest.raises(FileNotFoundError, match="not in the Hugging Face cache"):
        sl.load(REPO, revision="v9")
    with pytest.raises(ValueError, match="repo id"):
        sl.load(str(folder), revision="main")


def test_gguf_repo_needs_a_filename(smollm2_gguf, offline):
    hub_cache(offline, "test-org/smol-gguf", {"smol.Q4_1.gguf": smollm2_gguf})
    with pytest.raises(FileNotFoundError, match="GGUF repo: pass filename= one of smol.Q4_1.gguf"):
        sl.load("test-org/smol-gguf")
    m = sl.load("test-org/smol-gguf", filename="smol.Q4_1.gguf")
    assert m.name == "test-org/smol-gguf:smol.Q4_1.gguf" and m.config.n_layers == 30
    ids = np.array([1, 100, 200, 300])
    assert np.array_equal(m.run(ids, capture="logits").logits, sl.load(smollm2_gguf).run(ids, capture="logits").logits)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A stand-in for the hub on 127.0.0.1 (HF_ENDPOINT): repo info, file metadata (HEAD) and
    file contents, as huggingface_hub asks for them; ``requests`` records every path asked."""
    import http.server
    import threading
    import urllib.parse

    repos = {}          # repo id -> {relative path: bytes}
    requests = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _file(self):
            path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
            for repo, files in repos.items():
                prefix = f"{repo}/resolve/"
                if path.startswith(prefix):
                    rev, _, rel = path[len(prefix):].partition("/")
                    return files.get(rel) if rev in ("main", SHA) else None
            return None

        def _send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            requests.append(self.path)
            path = urllib.parse.urlparse(self.path).path
            if path.startswith("/api/models/") and "/tree/" in path:
                repo = path[len("/api/models/"):].partition("/tree/")[0]
                tree = [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                        for f, d in repos.get(repo, {}).items()]
                return self._send(200, json.dumps(tree).encode(), [("Content-Type", "application/json")])
            if path.startswith("/api/models/"):
                repo, _, rest = path[len("/api/models/"):].partition("/revision/")
                if repo not in repos:
                    return self._send(404, b'{"error": "Repository not found"}', [("X-Error-Code", "RepoNotFound")])
                body = json.dumps({"id": repo, "sha": SHA, "siblings": [{"rfilename": f} for f in repos[repo]]})
                return self._send(200, body.encode(), [("Content-Type", "application/json")])
            data = self._file()
            if data is None:
                return self._send(404, b"not found", [("X-Error-Code", "EntryNotFound")])
            etag = hashlib.sha256(data).hexdigest()
            self._send(200, data, [("X-Repo-Commit", SHA), ("ETag", f'"{etag}"'),
                                   ("Content-Type", "application/octet-stream")])

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield repos, requests
    server.shutdown()


def test_repo_id_downloaded_from_a_hub_endpoint(tiny, fake_hub, monkeypatch):
    hf, folder = tiny
    repos, requests = fake_hub
    repos[REPO] = {p.name: p.read_bytes() for p in folder.iterdir()}
    repos[REPO]["README.md"] = b"not downloaded: sinklab asks only for the files it reads"
    m = sl.load(REPO)
    assert m.name == REPO
    ids = np.array([1, 5, 9, 2, 7, 3])
    ref = hf_forward(hf, ids)["logits"]
    assert np.abs(m.run(ids, capture="logits").logits - ref).max() < 1e-4 * np.abs(ref).max()
    assert not any("README" in r for r in requests)
    snap = os.path.join(os.environ["HF_HOME"], "hub", "models--test-org--tiny-llama", "snapshots", SHA)
    assert os.path.realpath(m.source) == os.path.realpath(snap)
    # now in the cache: offline it loads without asking the hub
    n = len(requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sl.load(REPO).name == REPO and len(requests) == n
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(FileNotFoundError, match="no such model repo"):
        sl.load("test-org/nothing-here")
