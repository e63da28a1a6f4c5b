"""The pre-training data (sinklab.train.corpus, sinklab.train.packing): the paper's packing
strategies against a naive per-token construction from the document list, the resume-safe batch
order, the prepared corpus's files against independent recomputation (round trips, entropy,
split), atomic and cached preparation, and the real public-domain corpus's figures.

Everything but the last class runs on small synthetic documents in a tmp dir (a few seconds);
the real corpus is fetched from the Debian archive once per machine (~10 MB, ~10 s to prepare),
skips locally when offline and fails in CI (SINKLAB_REQUIRE_REFERENCE=1)."""
import hashlib
import io
import json
import math
import signal
import struct
import subprocess
import sys
import tarfile
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sinklab.train import corpus as C
from sinklab.train.packing import Packer, batch_size_for, tokens_per_step

BOS, EOS = 0, 1
PASSAGES = Path(__file__).resolve().parents[1] / "sinklab" / "data" / "passages.txt"


# --------------------------------------------------------------------------------------------
# Packing vs a naive construction
# --------------------------------------------------------------------------------------------

def synthetic_docs(n_docs=40, seed=0, vocab=50, max_len=30):
    """Documents of random lengths (1..max_len) of ids in [2, vocab): no bos/eos inside."""
    rng = np.random.default_rng(seed)
    return [list(rng.integers(2, vocab, size=int(rng.integers(1, max_len + 1)))) for _ in range(n_docs)]


def stream_of(docs):
    """Naive stream: each document then <eos>; and the document index of every token."""
    stream, doc_of = [], []
    for k, d in enumerate(docs):
        for t in list(d) + [EOS]:
            stream.append(int(t))
            doc_of.append(k)
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d) + 1)
    return np.array(stream, dtype=np.uint16), np.array(offsets, dtype=np.int64), doc_of


def naive_window(stream, doc_of, C_, fixed_bos, w):
    """Window w built token by token: the paper's definition, written out."""
    S = C_ - 1 if fixed_bos else C_
    ids, targets, key_start = [], [], []
    if fixed_bos:
        ids.append(BOS)
        targets.append(int(stream[w * S]))
        key_start.append(0)
    first = 1 if fixed_bos else 0
    for p in range(S):
        t = w * S + p
        ids.append(int(stream[t]))
        targets.append(int(stream[t + 1]))
        q = p  # walk back while the previous window token is of the same document
        while q > 0 and doc_of[w * S + q - 1] == doc_of[t]:
            q -= 1
        key_start.append(q + first)
    return ids, targets, key_start


CASES = [(ctx, fb, intra) for ctx in (2, 5, 16, 64) for fb in (False, True) for intra in (False, True)]


@pytest.mark.parametrize("ctx,fixed_bos,intra", CASES)
def test_windows_match_naive_construction(ctx, fixed_bos, intra):
    docs = synthetic_docs(seed=ctx)
    stream, offsets, doc_of = stream_of(docs)
    p = Packer(stream, offsets, ctx, fixed_bos=fixed_bos, bos_id=BOS, intra_doc=intra)
    S = ctx - 1 if fixed_bos else ctx
    n = 0
    while (n + 1) * S + 1 <= len(stream):   # window n needs its S tokens and one more target
        n += 1
    assert p.n_windows == n
    covered = []
    for w in range(n):
        ids, targets, ks = p.window(w)
        want_ids, want_targets, want_ks = naive_window(stream, doc_of, ctx, fixed_bos, w)
        assert ids.dtype == np.int64 and targets.dtype == np.int64 and ids.shape == (ctx,)
        assert ids.tolist() == want_ids
        assert targets.tolist() == want_targets
        if intra:
            assert ks.dtype == np.int64 and ks.tolist() == want_ks
        else:
            assert ks is None
        if fixed_bos:
            assert ids[0] == BOS
        covered.extend(ids[1 if fixed_bos else 0:].tolist())
    # consecutive, non-overlapping: the windows' text is the stream's prefix, and what is left
    # cannot make another window
    assert covered == stream[:n * S].tolist()
    assert len(stream) - n * S < S + 1
    with pytest.raises(IndexError):
        p.window(n)


def test_every_target_is_the_next_token():
    docs = synthetic_docs(n_docs=60, seed=3)
    stream, offsets, _ = stream_of(docs)
    for fixed_bos in (False, True):
        p = Packer(stream, offsets, 9, fixed_bos=fixed_bos, bos_id=BOS, intra_doc=False)
        ids, targets, _ = p.batch(step=2, batch_size=5, seed=11)
        for b, w in enumerate(p.batch_windows(2, 5, 11)):
            start = w * p.stride
            # position i's target is the stream token after the one at position i; with the fixed
            # bos, position 0 (bos) predicts the window's first stream token
            for i in range(9):
                src = start + i - (1 if fixed_bos else 0)
                assert targets[b, i] == stream[src + 1]
                if not (fixed_bos and i == 0):
                    assert ids[b, i] == stream[src]


@pytest.mark.parametrize("fixed_bos", [False, True])
def test_key_start_equals_dense_document_mask(fixed_bos):
    """Intra-document attention: the band [key_start[i], i] is exactly the keys of i's document
    (a dense comparison of document ids); with a fixed bos, key 0 is the bos, never in a band
    except its own."""
    docs = synthetic_docs(n_docs=80, seed=5, max_len=12)
    stream, offsets, doc_of = stream_of(docs)
    ctx = 32
    p = Packer(stream, offsets, ctx, fixed_bos=fixed_bos, bos_id=BOS, intra_doc=True)
    first = 1 if fixed_bos else 0
    for w in range(p.n_windows):
        _, _, ks = p.window(w)
        docid = np.full(ctx, -1)  # the bos has no document
        docid[first:] = [doc_of[w * p.stride + q] for q in range(p.stride)]
        i, j = np.meshgrid(np.arange(ctx), np.arange(ctx), indexing="ij")
        dense = (j <= i) & (docid[i] == docid[j])
        band = (j >= ks[:, None]) & (j <= i)
        assert np.array_equal(band, dense), w
        if fixed_bos:
            assert ks[0] == 0 and np.all(ks[1:] >= 1)
        # the <eos> belongs to the document it ends: the token after an <eos> starts a band
        ids = p.window(w)[0]
        for q in range(first, ctx - 1):
            if ids[q] == EOS:
                assert ks[q + 1] == q + 1 and ks[q] <= q


def test_batch_is_a_pure_function_of_seed_and_step():
    docs = synthetic_docs(n_docs=50, seed=7)
    stream, offsets, _ = stream_of(docs)
    p = Packer(stream, offsets, 8, fixed_bos=True, bos_id=BOS, intra_doc=True)
    n, B = p.n_windows, 6
    a = p.batch(13, B, seed=1234)
    for s in range(13):            # reading other steps first changes nothing
        p.batch(s, B, seed=1234)
    fresh = Packer(stream.copy(), offsets.copy(), 8, fixed_bos=True, bos_id=BOS, intra_doc=True)
    for x, y, z in zip(a, p.batch(13, B, seed=1234), fresh.batch(13, B, seed=1234)):
        assert np.array_equal(x, y) and np.array_equal(x, z)
    assert not np.array_equal(a[0], p.batch(13, B, seed=1235)[0])
    # the documented order: window of global index g is the (g mod n)-th of epoch g // n's
    # permutation default_rng([seed, epoch]).permutation(n)
    g = 13 * B + np.arange(B)
    want = [np.random.default_rng([1234, int(e)]).permutation(n)[int(i)] for e, i in zip(g // n, g % n)]
    assert p.batch_windows(13, B, 1234).tolist() == want
    for b, w in enumerate(want):
        assert np.array_equal(a[0][b], p.window(w)[0]) and np.array_equal(a[2][b], p.window(w)[2])


def test_each_epoch_reads_every_window_once():
    docs = synthetic_docs(n_docs=30, seed=9)
    stream, offsets, _ = stream_of(docs)
    p = Packer(stream, offsets, 7, fixed_bos=False, bos_id=BOS, intra_doc=False)
    n = p.n_windows
    seen = np.concatenate([p.batch_windows(s, 1, seed=5) for s in range(3 * n)])
    for e in range(3):
        assert sorted(seen[e * n:(e + 1) * n].tolist()) == list(range(n))
    assert not np.array_equal(seen[:n], seen[n:2 * n])  # a new order each epoch
    # a batch straddling an epoch boundary takes its tail from the next epoch
    B = n // 2 + 1
    straddle = p.batch_windows(1, B, seed=5)
    g = B + np.arange(B)
    assert straddle.tolist() == [np.random.default_rng([5, int(x // n)]).permutation(n)[int(x % n)] for x in g]


def test_equal_tokens_per_step_across_contexts():
    step_tokens = 8192
    for ctx in (64, 128, 256, 512, 1024):
        B = batch_size_for(ctx, step_tokens)
        assert B * ctx == step_tokens == tokens_per_step(ctx, B)
    docs = synthetic_docs(n_docs=400, seed=1, max_len=40)
    stream, offsets, _ = stream_of(docs)
    for ctx, fb in ((8, True), (16, False), (32, True)):
        p = Packer(stream, offsets, ctx, fixed_bos=fb, bos_id=BOS, intra_doc=False)
        ids, targets, _ = p.batch(0, batch_size_for(ctx, 64), seed=0)
        assert ids.size == targets.size == 64
    with pytest.raises(ValueError):
        batch_size_for(96, 8192 + 1)


def test_packer_rejects_bad_input():
    stream, offsets, _ = stream_of(synthetic_docs(n_docs=5, seed=2))
    with pytest.raises(ValueError):
        Packer(stream, offsets[:-1], 4, False, BOS, False)     # offsets do not reach the end
    with pytest.raises(ValueError):
        Packer(stream, offsets, 1, False, BOS, False)           # context < 2
    with pytest.raises(ValueError):
        Packer(stream[:3], np.array([0, 3]), 8, False, BOS, False)  # no whole window


# --------------------------------------------------------------------------------------------
# Building a corpus (synthetic documents: the Austen passages shipped with sinklab)
# --------------------------------------------------------------------------------------------

def passage_docs():
    lines = [x for x in PASSAGES.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [C.Document("austen", f"p{k}", t) for k, t in enumerate(lines)]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    docs = passage_docs()
    return docs, C.build_corpus(docs, tmp_path_factory.mktemp("c") / "small", vocab_size=400, quiet=True)


def test_built_corpus_streams(small_corpus):
    docs, c = small_corpus
    assert c.bos_id == BOS and c.eos_id == EOS
    assert c.tokenizer.token_to_id("<bos>") == 0 and c.tokenizer.token_to_id("<eos>") == 1
    assert c.vocab_size == c.tokenizer.get_vocab_size() == 400
    assert c.train_tokens.dtype == np.uint16 and isinstance(c.train_tokens, np.memmap)
    held = [k for k in range(len(docs)) if k % 50 == 49]
    assert sorted(c.heldout_doc_ids.tolist()) == held == [49, 99, 149]
    assert sorted(c.train_doc_ids.tolist()) == [k for k in range(len(docs)) if k not in held]
    for split in ("train", "heldout"):
        tokens, off, ids = (getattr(c, f"{split}_{x}") for x in ("tokens", "doc_offsets", "doc_ids"))
        assert off.dtype == np.int64 and off[0] == 0 and off[-1] == len(tokens)
        # <eos> exactly at each document's end, nowhere else; no <bos> in the stream
        assert np.flatnonzero(np.asarray(tokens) == EOS).tolist() == (off[1:] - 1).tolist()
        assert not np.any(np.asarray(tokens) == BOS)
        for k, doc_id in enumerate(ids):
            assert c.decode(tokens[off[k]:off[k + 1] - 1]) == docs[doc_id].text
    held_docs = c.heldout_documents()
    assert len(held_docs) == 3 and all(d.dtype == np.int64 for d in held_docs)
    for k, d in enumerate(held_docs):
        assert c.decode(d) == docs[c.heldout_doc_ids[k]].text and EOS not in d.tolist()
    # train stream: documents shuffled (not in their global order), deterministically
    assert c.train_doc_ids.tolist() != sorted(c.train_doc_ids.tolist())


def test_unigram_entropy_matches_direct_count(small_corpus):
    _, c = small_corpus
    counts = Counter(c.train_tokens.tolist())
    total = sum(counts.values())
    h = -sum(n / total * math.log(n / total) for n in counts.values())
    assert c.unigram_entropy == pytest.approx(h, rel=1e-12)
    assert 0 < c.unigram_entropy < math.log(c.vocab_size)


def test_tokenizer_round_trips_and_keeps_specials_out(small_corpus):
    _, c = small_corpus
    for text in ["It is a truth universally acknowledged.", "  spaces\tand\nnewlines  ",
                 "Ünïcødé — “quotes” £20,000 ἀρχή", "literal <bos> and <eos> in text", ""]:
        ids = c.encode(text)
        assert ids.dtype == np.int64
        assert c.tokenizer.decode(ids.tolist(), skip_special_tokens=False) == text
        assert BOS not in ids.tolist() and EOS not in ids.tolist()


def test_tokenizer_is_trained_on_the_train_split_only(tmp_path):
    """A string that occurs (many times) only in a held-out document gets no merge; the same
    documents with nothing held out do merge it (so the check can fail)."""
    docs = passage_docs()[:60]
    docs[49] = C.Document("x", "rare", " ".join(["zqxv"] * 3000))
    held = C.build_corpus(docs, tmp_path / "a", vocab_size=300, quiet=True)
    assert 49 in held.heldout_doc_ids.tolist()
    every = C.build_corpus(docs, tmp_path / "b", vocab_size=300, quiet=True, heldout_every=10 ** 6)
    assert len(every.encode("zqxv")) == 1
    assert len(held.encode("zqxv")) >= 3


def test_preparation_is_deterministic(tmp_path):
    docs = passage_docs()
    a = C.build_corpus(docs, tmp_path / "a", vocab_size=400, quiet=True)
    b = C.build_corpus(docs, tmp_path / "b", vocab_size=400, quiet=True)
    for name in ("tokenizer.json", "train.bin", "heldout.bin", "train_offsets.npy", "train_doc_ids.npy"):
        assert (a.root / name).read_bytes() == (b.root / name).read_bytes(), name


@pytest.mark.timing
def test_second_call_loads_from_cache(tmp_path):
    docs = passage_docs()
    a = C.build_corpus(docs, tmp_path / "c", vocab_size=300, quiet=True)
    stamp = (a.root / "tokenizer.json").stat().st_mtime_ns
    t0 = time.perf_counter()
    b = C.build_corpus([], tmp_path / "c", vocab_size=300, quiet=True)  # documents not even needed
    assert time.perf_counter() - t0 < 1.0
    assert (b.root / "tokenizer.json").stat().st_mtime_ns == stamp
    assert np.array_equal(a.train_tokens, b.train_tokens)


def test_interrupted_preparation_leaves_nothing_that_loads(tmp_path, monkeypatch):
    docs = passage_docs()
    out = tmp_path / "c"

    def killed(*a, **k):
        raise KeyboardInterrupt("killed while writing meta.json")

    monkeypatch.setattr(C, "_write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        C.build_corpus(docs, out, vocab_size=300, quiet=True)
    assert not out.exists() and not list(tmp_path.glob(".c.tmp-*"))
    monkeypatch.undo()
    # a stale temp folder of a preparation killed for real (SIGKILL: no cleanup ran)
    stale = tmp_path / ".c.tmp-999999999-dead"
    stale.mkdir()
    (stale / "train.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(FileNotFoundError):
        C.load_corpus(out)
    c = C.build_corpus(docs, out, vocab_size=300, quiet=True)
    assert c.meta["n_documents"] == len(docs)
    assert not stale.exists()  # its process is gone: removed


@pytest.mark.slow  # a corpus preparation subprocess, killed
def test_sigkill_during_preparation(tmp_path):
    """A preparation killed with SIGKILL after writing its streams leaves only its temporary
    folder; the next preparation ignores and removes it and produces the same corpus."""
    out = tmp_path / "c"
    code = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from sinklab.train import corpus as C
from test_train_data import passage_docs
def stop(*a, **k):
    print("READY", flush=True)
    time.sleep(60)
C._write_text = stop
C.build_corpus(passage_docs(), {str(out)!r}, vocab_size=300, quiet=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        tmps = list(tmp_path.glob(".c.tmp-*"))
        assert len(tmps) == 1 and (tmps[0] / "train.bin").is_file() and not out.exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not out.exists()
    c = C.build_corpus(passage_docs(), out, vocab_size=300, quiet=True)
    ref = C.build_corpus(passage_docs(), tmp_path / "ref", vocab_size=300, quiet=True)
    assert (c.root / "train.bin").read_bytes() == (ref.root / "train.bin").read_bytes()
    assert not list(tmp_path.glob(".c.tmp-*"))


# --------------------------------------------------------------------------------------------
# Source readers on hand-made inputs
# --------------------------------------------------------------------------------------------

def make_deb(path: Path, files: dict) -> None:
    """A .deb as dpkg-deb writes it: ar archive of debian-binary, control.tar.xz, data.tar.xz."""
    def tar_xz(members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo("./" + name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    out = bytearray(b"!<arch>\n")
    for name, data in (("debian-binary", b"2.0\n"), ("control.tar.xz", tar_xz({"control": b"x"})),
                       ("data.tar.xz", tar_xz(files))):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode("ascii") + data
        if len(data) % 2:
            out += b"\n"
    path.write_bytes(bytes(out))


def test_read_deb(tmp_path):
    files = {"usr/share/a/x.txt": b"hello", "usr/share/a/y.bin": bytes(range(7)), "usr/other": b"no"}
    make_deb(tmp_path / "p.deb", files)
    got = C.read_deb(tmp_path / "p.deb", "usr/share/a/")
    assert got == {"usr/share/a/x.txt": b"hello", "usr/share/a/y.bin": bytes(range(7))}
    (tmp_path / "bad.deb").write_bytes(b"not an archive")
    with pytest.raises(ValueError):
        C.read_deb(tmp_path / "bad.deb", "")


@pytest.mark.parametrize("four", [False, True])
def test_sword_entries(four):
    """zText/zCom (uint16 sizes, .bzv) and the "4" drivers (uint32 sizes, .czv): entries
    across two zlib blocks, an empty entry, two verses linked to one text."""
    texts = [[b"<w>In</w> the", b"beginning"], [b"And", b"linked text"]]
    blocks, zs, pos = [], b"", 0
    for blk in texts:
        raw = b"".join(blk)
        comp = zlib.compress(raw)
        zs += struct.pack("<III", pos, len(comp), len(raw))
        blocks.append(comp)
        pos += len(comp)
    fmt = "<III" if four else "<IIH"
    idx = [(0, 0, 0), (0, 0, 13), (0, 13, 9), (1, 0, 3), (1, 3, 11), (1, 3, 11)]
    ext = "c" if four else "b"
    d = "m"
    files = {f"{d}/ot.{ext}zs": zs, f"{d}/ot.{ext}zv": b"".join(struct.pack(fmt, *e) for e in idx),
             f"{d}/ot.{ext}zz": b"".join(blocks)}
    got = C.sword_entries(files, d, "ot")
    assert got == [None, b"<w>In</w> the", b"beginning", b"And", b"linked text", b"linked text"]
    assert got[4] is got[5]   # linked verses share one text (counted once per chapter)


def test_osis_to_text():
    markup = ('<div sID="a" type="x-p"/>In the <w lemma="strong:H7225">beginning</w> '
              '<divineName>Lord</divineName>.<note placement="foot">a footnote <seg>x</seg></note> '
              '<title type="x-s">EXPOSITION</title>Verse &amp; <hi type="italic">more</hi>'
              '<table><row><cell>a</cell><cell>b</cell></row></table>')
    assert C.osis_to_text(markup) == "In the beginning Lord.\nEXPOSITION\nVerse & more\na b"


def test_r_lazyload_reader():
    """An R lazy-load database written by hand in R's XDR format (version 3): the index
    list(variables=list(book=c(0L, n)), compressed=TRUE) and one character vector record."""
    def i32(*v):
        return struct.pack(f">{len(v)}i", *v)

    def charsxp(s):
        b = s.encode("utf-8")
        return i32(9 | (1 << 15), len(b)) + b

    def header():
        return b"X\n" + i32(3, 0x040201, 0x030500, 5) + b"UTF-8"

    def names_attr(*names):  # pairlist(names = c(...)), then NULL
        return i32(2 | (1 << 10)) + i32(1) + charsxp("names") + i32(16, len(names)) + \
            b"".join(charsxp(n) for n in names) + i32(254)

    record = header() + i32(16, 3) + charsxp("CHAPTER I") + i32(9, -1) + charsxp("Emma Woodhouse")
    blob = i32(len(record)) + zlib.compress(record)
    variables = i32(19 | (1 << 9), 1) + i32(13, 2, 0, len(blob)) + names_attr("book")
    index = header() + i32(19 | (1 << 9), 2) + variables + i32(10, 1, 1) + names_attr("variables", "compressed")
    import gzip
    got = C.read_r_lazyload(gzip.compress(index), blob)
    assert got == {"book": ["CHAPTER I", None, "Emma Woodhouse"]}


def test_fetch_source_checks_sha256_and_reports_offline(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    pool = mirror / "pool/main/x/x"
    pool.mkdir(parents=True)
    payload = b"a package" * 1000
    (pool / "x_1_all.deb").write_bytes(payload)
    good = C.DebSource("x", "x", "1", "pool/main/x/x/x_1_all.deb", hashlib.sha256(payload).hexdigest(),
                       len(payload), "test", "test")
    debs = tmp_path / "debs"
    monkeypatch.setenv(C.MIRROR_ENV, mirror.as_uri())
    bad = C.DebSource(**{**good.__dict__, "sha256": "0" * 64})
    with pytest.raises(C.CorpusFetchError, match="sha256"):
        C.fetch_source(bad, debs, quiet=True)
    assert list(debs.iterdir()) == []          # nothing cached, no temp file left
    assert C.fetch_source(good, debs, quiet=True).read_bytes() == payload
    monkeypatch.setenv(C.MIRROR_ENV, "http://127.0.0.1:9")   # nothing listens on the discard port
    other = C.DebSource(**{**good.__dict__, "pool_path": "pool/main/y/y/y_1_all.deb"})
    with pytest.raises(C.CorpusFetchError, match="Offline"):
        C.fetch_source(other, debs, quiet=True)
    assert isinstance(C.CorpusFetchError("x"), OSError)
    assert sorted(p.name for p in debs.iterdir()) == ["x_1_all.deb"]


# --------------------------------------------------------------------------------------------
# The real corpus
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_corpus(training_corpus):
    return training_corpus


class TestRealCorpus:
    def test_size_documents_and_split(self, real_corpus):
        c = real_corpus
        m = c.meta
        assert m["text_bytes"] >= 10_000_000
        # fixed by the pinned packages and the extraction rules (CORPUS_SOURCE.md)
        assert m["text_bytes"] == 23_863_612
        assert m["n_documents"] == 8424
        assert {k: v["documents"] for k, v in m["per_source"].items()} == \
            {"austen": 269, "kjv": 1189, "mhcc": 1189, "tdavid": 5777}
        assert m["train"]["documents"] == 8256 and m["heldout"]["documents"] == 168
        assert np.all(c.heldout_doc_ids % 50 == 49)
        assert sorted(np.concatenate([c.train_doc_ids, c.heldout_doc_ids]).tolist()) == list(range(8424))
        assert [s["sha256"] for s in m["sources"]] == [s.sha256 for s in C.SOURCES]
        assert c.vocab_size == 4096 and c.train_tokens.dtype == np.uint16
        assert len(c.train_tokens) > 5_000_000

    def test_streams(self, real_corpus):
        c = real_corpus
        for tokens, off in ((c.train_tokens, c.train_doc_offsets), (c.heldout_tokens, c.heldout_doc_offsets)):
            t = np.asarray(tokens)
            assert np.flatnonzero(t == EOS).tolist() == (off[1:] - 1).tolist()
            assert not np.any(t == BOS) and int(t.max()) < c.vocab_size
        docs = c.heldout_documents()
        assert [len(d) for d in docs] == (np.diff(c.heldout_doc_offsets) - 1).tolist()
        counts = np.bincount(np.asarray(c.train_tokens), minlength=c.vocab_size)
        p = counts[counts > 0] / counts.sum()
        assert c.unigram_entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-9)

    def test_tokenizer(self, real_corpus):
        c = real_corpus
        assert c.tokenizer.token_to_id("<bos>") == 0 and c.tokenizer.token_to_id("<eos>") == 1
        text = PASSAGES.read_text(encoding="utf-8").splitlines()[0]
        ids = c.encode(text)
        assert c.decode(ids) == text
        assert len(text) / len(ids) > 3.5   # a BPE fitted to English prose: several chars per token
        assert json.loads(c.tokenizer_path.read_text())["model"]["type"] == "BPE"

    @pytest.mark.timing
    def test_cached_load_is_fast(self, real_corpus):
        t0 = time.perf_counter()
        again = C.prepare_corpus(quiet=True)
        assert time.perf_counter() - t0 < 1.0
        assert again.root == real_corpus.root

    def test_packed_windows_on_real_stream(self, real_corpus):
        c = real_corpus
        p = Packer(c.train_tokens, c.train_doc_offsets, 256, fixed_bos=True, bos_id=c.bos_id, intra_doc=True)
        ids, targets, ks = p.batch(step=1000, batch_size=4, seed=0)
        assert ids.shape == targets.shape == ks.shape == (4, 256)
        assert np.all(ids[:, 0] == c.bos_id)
        for b in range(4):
            q = 1  # naive: a document starts after each <eos>
            for i in range(1, 256):
                if i > 1 and ids[b, i - 1] == c.eos_id:
                    q = i
                assert ks[b, i] == q
