"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, in process.

Strict mode turns every warning into a failure: a link to a page or an image that is not there, an
API name that mkdocstrings cannot resolve from the source, a docstring it cannot render. The checks
after the build are on the HTML it wrote: every page of the nav, every public name of
``sinklab.__all__`` documented, the notebooks rendered with their outputs, every figure a page
shows present as a PNG. A bogus API name in a throw-away site must fail the same build.
(The names, commands, paths and environment variables the pages mention are checked by
tests/test_docs.py.)
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.support.required import unavailable

try:  # the docs extra (also in the test extra): a skip locally, a failure in CI
    import mkdocs.config as mkdocs_config
    from mkdocs.commands import build as mkdocs_build
    from mkdocs.exceptions import Abort
    import mkdocs_jupyter  # noqa: F401
    import mkdocstrings_handlers.python  # noqa: F401
    MISSING = ""
except ImportError as e:
    MISSING = f"the docs extra (pip install '.[docs]'): {e}"

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mkdocs.yml"


def build(config_file: Path, site_dir: Path) -> None:
    """``mkdocs build --strict -f config_file -d site_dir``; raises mkdocs' Abort on any warning."""
    if MISSING:
        unavailable(MISSING)
    cfg = mkdocs_config.load_config(config_file=str(config_file), site_dir=str(site_dir), strict=True)
    mkdocs_build.build(cfg)


def nav_pages(nav) -> list:
    """The source paths of every page in mkdocs.yml's nav (nested sections flattened)."""
    out = []
    for entry in nav:
        value = list(entry.values())[0] if isinstance(entry, dict) else entry
        out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def page_html(site: Path, src: str) -> str:
    """The HTML mkdocs wrote for the page whose source is ``src`` (directory URLs)."""
    stem = re.sub(r"\.(md|ipynb)$", "", src)
    path = site / "index.html" if stem == "index" else site / stem / "index.html"
    assert path.is_file(), f"{src}: no {path.relative_to(site)}"
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build(CONFIG, out)
    return out


def test_site_builds_strict_with_every_nav_page(site):
    cfg = mkdocs_config.load_config(config_file=str(CONFIG))  # the site fixture checked the import
    pages = nav_pages(cfg["nav"])
    assert len(pages) >= 29, pages
    for src in pages:
        html = page_html(site, src)
        assert "<h1" in html, src
    # every Markdown page of docs/ is in the nav (a page left out would be built but unreachable)
    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk <= set(pages), sorted(on_disk - set(pages))


def test_every_public_name_has_an_api_entry(site):
    import sinklab

    html = "".join(page_html(site, f"api/{p.name}") for p in sorted((ROOT / "docs" / "api").glob("*.md")))
    for name in sinklab.__all__:
        module = getattr(sinklab, name).__module__
        # mkdocstrings gives each documented object an anchor with its full path
        assert f'id="{module}.{name}"' in html, f"sinklab.{name} ({module}) has no API entry"
    # the docstrings were rendered, not just the headings: a phrase of Model.run's docstring
    assert "attention probabilities" in page_html(site, "api/model.md")
    # docs/hooks/rst_docstrings.py: no reStructuredText role left, and Model.run's capture table
    # (a simple table) is preformatted, its columns kept
    assert ":class:`" not in html and ":func:`" not in html
    run = page_html(site, "api/model.md").split('id="sinklab.model.Model.run"')[1]
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", run.split('id="sinklab.model.Model.', 1)[0], flags=re.S)
    assert any("TransformerLens hook" in b for b in blocks), "Model.run's capture table is not preformatted"


def test_notebooks_are_rendered_with_their_outputs(site):
    for name, phrase in (("reproduce_paper", "compare_bos"), ("training", "prepare_corpus")):
        html = page_html(site, f"notebooks/{name}.ipynb")
        assert phrase in html, name
        assert html.count("data:image/png;base64") >= 3, f"{name}: the shipped figures are not in the page"


def test_every_figure_a_page_shows_is_a_png(site):
    shown = set()
    for p in (ROOT / "docs").rglob("*.md"):
        shown |= set(re.findall(r"\]\(\.\./figures/([\w./-]+\.png)\)", p.read_text(encoding="utf-8")))
    assert len(shown) >= 12, shown
    # the beyond-the-paper pages show every committed figure of the quick report (notebooks/results/beyond/)
    assert {n for n in shown if n.startswith("beyond/")} == {
        f"beyond/{f.name}" for f in (ROOT / "notebooks" / "results" / "beyond").glob("*.png")}, shown
    for name in sorted(shown):
        data = (site / "figures" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_a_bogus_api_name_fails_the_strict_build(tmp_path):
    # a one-page copy of the site's mkdocstrings setup, so the failing build is cheap
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n::: sinklab.model.NoSuchClass\n")
    cfg = CONFIG.read_text(encoding="utf-8")
    plugins = cfg[cfg.index("  - mkdocstrings:"):cfg.index("\nnav:")]
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: t\ndocs_dir: docs\nplugins:\n"
        f"{plugins.replace('paths: [.]', f'paths: [{ROOT}]').replace('- docs/hooks/', f'- {ROOT}/docs/hooks/')}\n")
    if MISSING:
        unavailable(MISSING)
    with pytest.raises(Abort):  # mkdocs counts the warning and aborts at the end of the build
        build(tmp_path / "mkdocs.yml", tmp_path / "site")
    # and the same page with a real name builds
    (tmp_path / "docs" / "index.md").write_text("# x\n\n::: sinklab.model.Model\n")
    build(tmp_path / "mkdocs.yml", tmp_path / "site")
