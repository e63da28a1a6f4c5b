"""The README (the front page), the documentation pages and benchmarks/RESULTS.md checked against
the code they describe.

- README: every ``sl.x`` / ``sinklab.x.y`` name (and ``model.f(`` / ``tr.f(``) exists; every
  ``sinklab SUBCOMMAND --flag`` it shows is in sinklab/cli.py's parser (values shown as
  ``a|b|c`` among the flag's choices), and every ``--flag`` in its prose in some parser; every
  environment variable it names is read or set somewhere in the code (THIRD_PARTY_ENV aside);
  every repository path and test file it names exists; its ``#anchor`` links resolve.
- docs/**/*.md (the documentation site, tests/test_docs_site.py builds it): the same checks as the
  README's, page by page.
- The package: every ``sinklab.x.y`` name in a docstring or comment exists.
- benchmarks/RESULTS.md: each summary row has a command, a date and a CPU; every
  ``benchmarks/X.py --flag`` command in it (and in the README) names a script that defines the
  flag; its headings are unique and its links resolve; every section the code, the README or a
  documentation page cites by name (RESULTS.md, then the heading in double quotes) exists.
- Citations of the documentation: every ``docs/....md`` page the code, the tests, CI, RESULTS.md,
  the README or a page names exists, and every section cited by name (the page or README, a comma
  or "'s", the heading in double quotes) is a heading of that page.
(tests/test_readme.py checks the quick start against CI; nothing of that is repeated here.)

Each checker is a function of the text that returns the problems it found, so the tests below can
show on a synthetic text that it does fail on a bogus name.
"""
from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
# The documentation site's pages (mkdocs.yml): checked with the README's checkers
DOCS = ROOT / "docs"

# Where an environment variable counts as read or set: the package, the C core, the build, CI, the
# tests and the benchmarks.
CODE_DIRS = ("sinklab", "csrc", ".ci", "tests", "benchmarks")
CODE_FILES = ("setup.py",)
ENV_PATTERN = re.compile(r"\b(?:SINKLAB|OMP|GOMP|OPENBLAS|KMP|MKL)_[A-Z0-9_]*[A-Z0-9]\b")

# Variables the README may name that only a third party reads (so no code here needs to), each
# with the reason. Kept small; test_env_allow_list_is_used fails on a stale entry.
THIRD_PARTY_ENV: Dict[str, str] = {
    "OMP_WAIT_POLICY": "libgomp reads it when it loads; the README names it as the user's alternative "
                       "to the GOMP_SPINCOUNT that `import sinklab` sets",
}

# Flags the README shows for commands other than `sinklab`, with the file that must define them.
OTHER_FLAGS: Dict[str, Optional[str]] = {
    "--jobs": "examples/cluster/sweep_on_slurm.py",
    "--pbs": "examples/cluster/sweep_on_slurm.py",
    "--print-job-script": "examples/cluster/sweep_on_slurm.py",
    "--no-deps": None,  # `pip download --no-deps`, pip's own flag
    "--no-cache-dir": None,  # `pip install --no-cache-dir`, pip's own flag
    "--durations": None,  # `python -m pytest --durations=25`, pytest's own flag
    "--dist": None,  # `python -m pytest -n 2 --dist loadfile`, pytest-xdist's flag
    "--strict": None,  # `mkdocs build --strict`, MkDocs' own flag (the documentation site)
    "--from-json": "sinklab/train/miniature.py",  # `python -m sinklab.train.miniature --from-json`
}


# -- Python names --------------------------------------------------------------------------------

def resolve(dotted: str) -> object:
    """The object ``dotted`` (``sinklab.a.b.C``) names: modules imported as needed, attributes
    looked up on them; raises ImportError or AttributeError when it does not exist."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    prefix = parts[0]
    for part in parts[1:]:
        prefix = f"{prefix}.{part}"
        if hasattr(obj, part):
            obj = getattr(obj, part)
        else:  # a submodule not imported by its package
            try:
                obj = importlib.import_module(prefix)
            except ModuleNotFoundError as e:
                raise AttributeError(f"{prefix}: {e}") from None
    return obj


def python_names(text: str) -> List[str]:
    """Dotted ``sinklab.*`` names in ``text``: ``sl.x`` (as ``sinklab.x``), ``sinklab.a.b`` and
    ``from sinklab.a import b, c``."""
    names = [m.group(1) for m in re.finditer(r"\b(sinklab(?:\.[A-Za-z_]\w*)+)", text)]
    names += ["sinklab." + m.group(1) for m in re.finditer(r"\bsl\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text)]
    for m in re.finditer(r"^\s*from (sinklab(?:\.\w+)*) import ([\w, ]+)$", text, flags=re.M):
        names += [f"{m.group(1)}.{n.strip()}" for n in m.group(2).split(",") if n.strip()]
    return sorted(set(names))


def missing_python_names(text: str) -> List[str]:
    """The names of :func:`python_names` that do not exist, each with the reason."""
    return [f"{name} ({type(e).__name__}: {e})" for name, e in unresolved(python_names(text))]


def unresolved(names: Iterable[str]) -> List[Tuple[str, Exception]]:
    """(name, the ImportError or AttributeError) for each of ``names`` that :func:`resolve` cannot find."""
    bad = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            bad.append((name, e))
    return bad


def _instance_attributes(cls: type) -> set:
    """Attributes a class's methods assign on ``self`` (``self.config = ...``)."""
    import inspect

    src = inspect.getsource(inspect.getmodule(cls))
    tree = ast.parse(src)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self" and isinstance(sub.ctx, ast.Store)):
                    found.add(sub.attr)
    return found


def missing_methods(text: str) -> List[str]:
    """``model.f(`` and ``model.config`` on :class:`sinklab.Model`, ``tr.f(`` on
    :class:`sinklab.Trace`, that neither class has."""
    import sinklab

    bad = []
    for var, cls in (("model", sinklab.Model), ("tr", sinklab.Trace)):
        have = set(dir(cls)) | _instance_attributes(cls)
        used = {m.group(1) for m in re.finditer(rf"(?<![\w.]){var}\.([A-Za-z_]\w*)\(", text)}
        used |= {m.group(1) for m in re.finditer(rf"(?<![\w.]){var}\.(config)\b", text)}
        bad += [f"{var}.{name} (no such attribute of {cls.__name__})" for name in sorted(used - have)]
    return bad


# -- command line --------------------------------------------------------------------------------

def _subparsers(parser) -> Dict[str, object]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def sinklab_invocations(text: str) -> List[Tuple[str, str]]:
    """(command, its part of the text) for each ``sinklab ...`` invocation in a code span or a
    code-block line; command is the subcommand, or "" for the main parser (``sinklab --version``)."""
    pieces = re.findall(r"`([^`\n]+)`", text)
    pieces += [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S) for line in block.splitlines()]
    found = []
    for piece in pieces:
        piece = piece.split(" #")[0]  # a shell comment beside the command
        for part in re.split(r"&&|;|\s>\s", piece):
            # the command word itself (after any VAR=value), not `import sinklab as sl`
            m = re.match(r"\s*(?:\w+=\S+\s+)*sinklab((?:\s+\S+)*)\s*$", part)
            if m:
                words = m.group(1).split()
                sub = words[0] if words and not words[0].startswith("-") else ""
                found.append((sub, part.strip()))
    return found


def unknown_cli_flags(text: str, parser=None) -> List[str]:
    """Flags shown on a ``sinklab SUB ...`` invocation that neither SUB's parser nor the main one
    (global options) defines, and subcommands the parser does not have."""
    if parser is None:
        from sinklab.cli import build_parser

        parser = build_parser()
    subs = _subparsers(parser)
    bad = []
    for sub, part in sinklab_invocations(text):
        if sub and sub not in subs:
            if re.fullmatch(r"[a-z][a-z-]*", sub):  # a word, not a file name or placeholder
                bad.append(f"sinklab {sub}: no such subcommand ({part!r})")
            continue
        known = set(parser._option_string_actions)
        if sub:
            known |= set(subs[sub]._option_string_actions)
        actions = dict(parser._option_string_actions)
        if sub:
            actions.update(subs[sub]._option_string_actions)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", part):
            if flag not in known:
                bad.append(f"sinklab {sub} {flag}: not an option of the parser ({part!r})")
        # values shown as alternatives (`--profile quick|cpu|full`) must be among the choices
        for flag, alts in re.findall(r"(--[a-z][a-z0-9-]*) ([\w.]+(?:\|[\w.]+)+)", part):
            choices = getattr(actions.get(flag), "choices", None)
            if choices is not None:
                bad += [f"sinklab {sub} {flag} {v}: not one of {sorted(choices)}"
                        for v in alts.split("|") if v not in choices]
    return bad


def unknown_flags_anywhere(text: str, parser=None) -> List[str]:
    """Every ``--flag`` in the text, also in prose (``--workers`` and ``--threads`` override
    this): an option of some sinklab parser, or of another command listed in OTHER_FLAGS."""
    if parser is None:
        from sinklab.cli import build_parser

        parser = build_parser()
    known = set(parser._option_string_actions)
    for sub in _subparsers(parser).values():
        known |= set(sub._option_string_actions)
    bad = []
    for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))):
        if flag in known:
            continue
        if flag in OTHER_FLAGS:
            owner = OTHER_FLAGS[flag]
            if owner is None or f'"{flag}"' in (ROOT / owner).read_text():
                continue
            bad.append(f"{flag}: not defined in {owner}")
        else:
            bad.append(f"{flag}: no sinklab parser has it")
    return bad


# -- environment variables and paths -------------------------------------------------------------

def _python_strings(path: Path) -> Iterable[str]:
    """The string constants and keyword-argument names of a Python file, docstrings excluded (a
    docstring names a variable, it does not read it)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return []
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    strings = [n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]
    # dict(os.environ, OPENBLAS_NUM_THREADS=...) names the variable as a keyword
    return strings + [n.arg for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg]


@functools.lru_cache(maxsize=None)  # one scan of the repository per test session
def code_env_names() -> frozenset:
    """Environment variable names the code reads or sets: in Python string constants (not
    docstrings), in C string literals, and on non-comment lines of shell scripts."""
    files = [ROOT / f for f in CODE_FILES]
    for d in CODE_DIRS:
        files += [p for p in (ROOT / d).rglob("*") if p.is_file()]
    names = set()
    for p in files:
        if p == Path(__file__).resolve():  # this file's synthetic names are not read anywhere
            continue
        if p.suffix == ".py":
            for s in _python_strings(p):
                names |= set(ENV_PATTERN.findall(s))
        elif p.suffix in (".c", ".h"):
            for lit in re.findall(r'"([^"\n]*)"', p.read_text(encoding="utf-8", errors="replace")):
                names |= set(ENV_PATTERN.findall(lit))
        elif p.suffix == ".sh" or (p.suffix == "" and p.parent.name == ".ci"):  # shell scripts
            for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
                if not line.lstrip().startswith("#"):
                    names |= set(ENV_PATTERN.findall(line))
    return frozenset(names)


def unread_env_names(text: str, code_names: Optional[frozenset] = None) -> List[str]:
    """Environment variables the text names that no code reads or sets (THIRD_PARTY_ENV aside)."""
    if code_names is None:
        code_names = code_env_names()
    named = set(ENV_PATTERN.findall(text))
    return sorted(n for n in named - code_names if n not in THIRD_PARTY_ENV)


PATH_PATTERN = re.compile(r"(?<![\w/.~$-])((?:sinklab|csrc|tests|benchmarks|notebooks|examples|\.ci)/[\w./-]*)")


def missing_paths(text: str) -> List[str]:
    """Repository paths the text names (``sinklab/io/registry.py``, ``notebooks/results/``) that
    do not exist."""
    bad = []
    for path in sorted(set(PATH_PATTERN.findall(text))):
        path = path.rstrip(".")
        if not (ROOT / path).exists():
            bad.append(path)
    return bad


def missing_test_files(text: str) -> List[str]:
    """Test files named without their folder (``test_tokenizer.py``) that no folder under tests/
    holds."""
    names = sorted(set(re.findall(r"(?<![\w/])(test_\w+\.py)\b", text)))
    return [n for n in names if not any((ROOT / "tests").rglob(n))]


def docs_and_comments(path: Path) -> str:
    """A Python file's docstrings and comments, the text that describes the code."""
    import io
    import tokenize

    src = path.read_text(encoding="utf-8")
    parts = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    parts += [tok.string for tok in tokenize.generate_tokens(io.StringIO(src).readline)
              if tok.type == tokenize.COMMENT]
    return "\n".join(parts)


def missing_names_in_package_docs() -> List[str]:
    """``sinklab.a.b`` names in the package's docstrings and comments that do not exist."""
    bad = []
    for p in sorted((ROOT / "sinklab").rglob("*.py")):
        text = docs_and_comments(p)
        names = sorted(set(re.findall(r"(?<![\w/])(sinklab(?:\.[A-Za-z_]\w*)+)", text)))
        bad += [f"{p.relative_to(ROOT)}: {name} ({e})" for name, e in unresolved(names)]
    return bad


# -- RESULTS.md ----------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(md: str) -> List[str]:
    """The headings of a Markdown text, outside code blocks, without their #s."""
    out, in_code = [], False
    for line in md.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def summary_rows(md: str) -> List[List[str]]:
    """The rows of RESULTS.md's summary table: [topic, headline, command, date, CPU]."""
    section = md.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|")]
    return [r for r in rows[2:]]  # header and rule


def script_source(path: Path) -> str:
    """A benchmark script's source, with that of the tests/support module it wraps when it is a
    command-line wrapper (``from tests.support.X import main``): where its flags are defined."""
    src = path.read_text()
    for wrapped in re.findall(r"^from (tests\.support\.\w+) import", src, re.M):
        src += (ROOT / (wrapped.replace(".", "/") + ".py")).read_text()
    return src


def bad_summary_commands(md: str) -> List[str]:
    """Summary rows without a command, date or CPU, commands naming a benchmark script that does not
    exist, or a flag that script does not define."""
    bad = []
    rows = summary_rows(md)
    if not rows:
        return ["no summary table"]
    for row in rows:
        if len(row) != 5 or not all(row):
            bad.append(f"row {row[:1]}: needs topic, headline, command, date and CPU")
            continue
        if not re.search(r"20\d\d-\d\d-\d\d", row[3]):
            bad.append(f"row {row[0]}: date {row[3]!r}")
        for cmd in re.findall(r"`([^`]+)`", row[2]):
            script = re.search(r"(benchmarks/\w+\.py)", cmd)
            if script is None:
                continue
            path = ROOT / script.group(1)
            if not path.exists():
                bad.append(f"row {row[0]}: {script.group(1)} does not exist")
                continue
            src = script_source(path)
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", cmd.split(script.group(1), 1)[1]):
                if f'"{flag}"' not in src and f"'{flag}'" not in src:
                    bad.append(f"row {row[0]}: {script.group(1)} has no {flag}")
    return bad


def bad_benchmark_commands(md: str) -> List[str]:
    """``benchmarks/X.py --flag ...`` anywhere in the text (code spans, code blocks, prose) whose
    script does not exist or does not define the flag."""
    bad = []
    for m in re.finditer(r"(benchmarks/\w+\.py)([^`\n]*)", md):
        path = ROOT / m.group(1)
        if not path.exists():
            bad.append(f"{m.group(1)} does not exist")
            continue
        src = script_source(path)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)):
            if f'"{flag}"' not in src and f"'{flag}'" not in src:
                bad.append(f"{m.group(1)} has no {flag} ({m.group(0).strip()!r})")
    return sorted(set(bad))


def cited_results_sections() -> List[Tuple[str, str]]:
    """(file, section) for each citation of a RESULTS.md section by its quoted name (the file's
    name, a comma, the heading in double quotes) in the code, the README and the documentation pages."""
    cites = []
    files = ([README] + sorted(DOCS.rglob("*.md"))
             + [p for d in ("sinklab", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")])
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r'RESULTS\.md[^"\n]{0,3}"([^"\n]+)"', text):
            cites.append((str(p.relative_to(ROOT)), m.group(1)))
    return cites


# a documentation page (or the README) cited with one of its sections: docs/guides/precision.md, "Heading"
DOC_CITATION = re.compile(r"(README(?:\.md)?|docs/[\w/.-]+?\.md)(?:,\s+|'s\s+)\"([^\"\n]+)\"")
DOC_PATH = re.compile(r"\bdocs/[\w/.-]+?\.md\b")


def doc_citation_problems(text: str) -> List[str]:
    """Pages under docs/ that ``text`` names and that do not exist, and sections it cites by name
    (the page or README, a comma or "'s", the heading in double quotes) that are no heading there."""
    bad = []
    for m in DOC_PATH.finditer(text):
        if not (ROOT / m.group(0)).is_file():
            bad.append(f"{m.group(0)} does not exist")
    for m in DOC_CITATION.finditer(text):
        page = README if m.group(1).startswith("README") else ROOT / m.group(1)
        if page.is_file() and m.group(2) not in headings(page.read_text(encoding="utf-8")):
            bad.append(f'{m.group(1)}, "{m.group(2)}": no such heading there')
    return sorted(set(bad))


def doc_citing_files() -> List[Path]:
    """Where the documentation is cited: the package, tests, benchmarks, CI, examples, RESULTS.md,
    the README and the pages themselves (this file aside: its synthetic cases are bogus on purpose)."""
    files = [README, RESULTS] + sorted(DOCS.rglob("*.md")) + sorted((ROOT / ".ci").iterdir())
    for d in ("sinklab", "tests", "benchmarks", "examples"):
        files += sorted(p for p in (ROOT / d).rglob("*.py"))
    return [p for p in files if p.is_file() and p != Path(__file__).resolve()]


# -- the tests -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def results() -> str:
    return RESULTS.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def doc_pages() -> Dict[str, str]:
    """The documentation site's Markdown pages, by path under docs/."""
    pages = {str(p.relative_to(DOCS)): p.read_text(encoding="utf-8") for p in sorted(DOCS.rglob("*.md"))}
    assert len(pages) >= 20, sorted(pages)  # the site is there at all
    return pages


def test_every_python_name_the_readme_gives_exists(readme):
    names = python_names(readme)
    assert len(names) >= 30, names  # the extraction finds the README's names at all
    assert missing_python_names(readme) == []
    assert missing_methods(readme) == []


def test_every_cli_invocation_the_readme_shows_parses(readme):
    subs = {sub for sub, _ in sinklab_invocations(readme)}
    assert {"sinks", "reproduce", "train", "experiment", "sweep"} <= subs, subs
    assert unknown_cli_flags(readme) == []
    assert unknown_flags_anywhere(readme) == []
    assert bad_benchmark_commands(readme) == []


def test_every_environment_variable_the_readme_names_is_read(readme):
    named = set(ENV_PATTERN.findall(readme))
    assert {"SINKLAB_HOME", "SINKLAB_SIMD", "GOMP_SPINCOUNT"} <= named, named
    assert unread_env_names(readme) == []


def test_every_environment_variable_results_and_docstrings_name_is_read(results):
    code = code_env_names()
    assert unread_env_names(results, code) == []
    for d in ("sinklab", "benchmarks", "tests"):
        for p in sorted((ROOT / d).rglob("*.py")):
            if p != Path(__file__).resolve():
                assert unread_env_names(docs_and_comments(p), code) == [], p


def test_env_allow_list_is_used(readme):
    # a third-party variable the README no longer names must leave the allow-list
    assert [n for n in THIRD_PARTY_ENV if n not in readme] == []


def test_every_path_the_docs_name_exists(readme, results):
    assert missing_paths(readme) == [] and missing_test_files(readme) == []
    assert missing_paths(results) == [] and missing_test_files(results) == []


def test_every_sinklab_name_in_the_package_docstrings_exists():
    assert missing_names_in_package_docs() == []


def test_results_summary_commands_and_links(results):
    assert len(summary_rows(results)) >= 15
    assert bad_summary_commands(results) == []
    assert bad_benchmark_commands(results) == []
    hs = headings(results)
    assert len(set(map(slug, hs))) == len(hs), "two headings with one anchor: links would go to the first"
    anchors = {slug(h) for h in hs}
    links = re.findall(r"\]\(#([\w-]+)\)", results)
    assert links and [a for a in links if a not in anchors] == []


def test_results_sections_the_code_cites_exist(results):
    cites = cited_results_sections()
    assert cites, "no citation found: the pattern no longer matches the code's"
    have = set(headings(results))
    assert [c for c in cites if c[1] not in have] == []


def test_doc_pages_and_sections_the_code_cites_exist():
    bad, named = {}, 0
    for p in doc_citing_files():
        text = p.read_text(encoding="utf-8", errors="replace")
        named += len(DOC_PATH.findall(text))
        if doc_citation_problems(text):
            bad[str(p.relative_to(ROOT))] = doc_citation_problems(text)
    assert named >= 20, named  # the README and the code do point into the documentation
    assert bad == {}


def test_readme_links_to_its_own_sections(readme):
    anchors = {slug(h) for h in headings(readme)}
    assert [a for a in re.findall(r"\]\(#([\w-]+)\)", readme) if a not in anchors] == []


def test_every_name_command_and_path_the_doc_pages_give_exists(doc_pages):
    every = "\n".join(doc_pages.values())
    assert len(python_names(every)) >= 30  # the extraction finds the pages' names at all
    assert {sub for sub, _ in sinklab_invocations(every)} >= {"sinks", "reproduce", "train", "experiment", "sweep"}
    bad = {}
    for page, text in doc_pages.items():
        problems = (missing_python_names(text) + missing_methods(text) + unknown_cli_flags(text)
                    + unknown_flags_anywhere(text) + bad_benchmark_commands(text)
                    + missing_paths(text) + missing_test_files(text))
        if problems:
            bad[page] = problems
    assert bad == {}


def test_every_environment_variable_the_doc_pages_name_is_read(doc_pages):
    code = code_env_names()
    named = set(ENV_PATTERN.findall("\n".join(doc_pages.values())))
    assert {"SINKLAB_HOME", "SINKLAB_NUM_THREADS", "SINKLAB_SIMD"} <= named, named
    assert {page: unread_env_names(text, code) for page, text in doc_pages.items()
            if unread_env_names(text, code)} == {}


# -- the checkers do fail ------------------------------------------------------------------------

def test_checkers_fail_on_bogus_names(readme):
    # each bogus name is added to a copy of the real text, so the check sees it among the real ones
    text = readme + "\n`sl.no_such_function(x)` and `sinklab.analysis.no_such_module.f`\n"
    bad = missing_python_names(text)
    assert any("sinklab.no_such_function" in b for b in bad)
    assert any("sinklab.analysis.no_such_module" in b for b in bad)
    assert missing_methods(readme + "\n`model.no_such_method(ids)`\n") == [
        "model.no_such_method (no such attribute of Model)"]

    bad = unknown_cli_flags(readme + "\n- `sinklab sinks MODEL [--no-such-flag]`\n- `sinklab frobnicate --x`\n")
    assert any("--no-such-flag" in b for b in bad) and any("frobnicate" in b for b in bad)
    # a flag of another subcommand is not accepted: --families belongs to reproduce, not sinks
    assert any("--families" in b for b in unknown_cli_flags("`sinklab sinks MODEL --families`"))
    assert unknown_cli_flags("`sinklab experiment fig5 [--profile quick|huge]`") == [
        "sinklab experiment --profile huge: not one of ['cpu', 'cpu2x', 'full', 'miniature', 'miniature-xl', 'quick']"]
    assert unknown_flags_anywhere(readme + "\n`--no-such-option` overrides this\n") == [
        "--no-such-option: no sinklab parser has it"]

    assert unread_env_names(readme + "\nset `SINKLAB_NO_SUCH_VARIABLE=1`\n") == ["SINKLAB_NO_SUCH_VARIABLE"]
    assert missing_paths(readme + "\nsee `sinklab/no_such_file.py`\n") == ["sinklab/no_such_file.py"]
    assert missing_test_files(readme + "\n(`test_no_such_thing.py`)\n") == ["test_no_such_thing.py"]

    assert doc_citation_problems(readme + "\nsee docs/guides/no-such-page.md\n") == [
        "docs/guides/no-such-page.md does not exist"]
    assert doc_citation_problems('the docs/guides/precision.md, "No such heading" table') == [
        'docs/guides/precision.md, "No such heading": no such heading there']
    assert doc_citation_problems('the README\'s "Precision" section') == ['README, "Precision": no such heading there']
    assert doc_citation_problems('docs/guides/training.md, "Fig. 5 and Table 2 in miniature"') == []


def test_docstring_scan_sees_docstrings_and_comments_only(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('"""See sinklab.a."""\nx = "sinklab.not_a_doc"  # sinklab.b\ndef f():\n    """sinklab.c"""\n')
    text = docs_and_comments(src)
    assert "sinklab.a" in text and "sinklab.b" in text and "sinklab.c" in text
    assert "sinklab.not_a_doc" not in text


def test_env_scan_ignores_docstrings_and_comments(tmp_path):
    # a variable only mentioned (docstring, comment) is not read; one in code is
    src = tmp_path / "m.py"
    src.write_text('"""Reads SINKLAB_DOC_ONLY."""\n# SINKLAB_COMMENT_ONLY\nimport os\nos.environ.get("SINKLAB_READ")\n'
                   'env = dict(os.environ, OMP_SET_HERE="1")\n')
    strings = [s for s in _python_strings(src)]
    found = set().union(*(ENV_PATTERN.findall(s) for s in strings))
    assert found == {"SINKLAB_READ", "OMP_SET_HERE"}


def test_results_checkers_fail_on_bad_rows(results):
    bogus = results.replace(
        "\n## Contents", "\n| bogus | 1× | `python benchmarks/bench_forward.py --no-such-flag` | 2026-12-01 | AMD EPYC |"
        "\n| nowhere | 1× | `python benchmarks/bench_nowhere.py` | 2026-12-01 | AMD EPYC |"
        "\n| undated | 1× | `python benchmarks/bench_forward.py` | soon | AMD EPYC |\n\n## Contents", 1)
    bad = bad_summary_commands(bogus)
    assert any("bench_forward.py has no --no-such-flag" in b for b in bad)
    assert any("bench_nowhere.py does not exist" in b for b in bad)
    assert any("date 'soon'" in b for b in bad)
    assert bad_benchmark_commands(results + "\n`python benchmarks/bench_sgemm.py --no-such-flag`\n") == [
        "benchmarks/bench_sgemm.py has no --no-such-flag ('benchmarks/bench_sgemm.py --no-such-flag')"]
    assert slug("Robustness: fuzzing, sanitizers, valgrind") == "robustness-fuzzing-sanitizers-valgrind"
    assert "Under contention" in headings(results) and "Under no contention" not in headings(results)


def test_the_beyond_pages_give_the_committed_reports_computed_readings():
    """docs/beyond/report.md shows the committed beyond-the-paper report's summary table as the
    code computes it from that report's numbers (notebooks/results/beyond/beyond.json), so a
    page cannot keep a reading the numbers no longer give."""
    import json

    from sinklab.report.beyond import summary_table

    res = json.loads((ROOT / "notebooks" / "results" / "beyond" / "beyond.json").read_text(encoding="utf-8"))
    page = (DOCS / "beyond" / "report.md").read_text(encoding="utf-8")
    assert summary_table(res) in page, summary_table(res)
