"""Griffe extension for the API pages: the two reStructuredText forms sinklab's docstrings use,
turned into Markdown before mkdocstrings renders them.

- roles (``:class:`Trace``` , ``:func:`~sinklab.x.f```) become code spans;
- simple tables (columns under rules of ``=``) become preformatted blocks, so their columns stay
  aligned instead of running together into one paragraph.

The docstrings stay as they are (readable in ``help()``); only the site's rendering changes.
"""
from __future__ import annotations

import re
from typing import Any, List

import griffe

ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|const):`~?([^`]+)`")
RULE = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def fence_tables(text: str) -> str:
    """Each simple table (from its first ``===  ===`` rule to the line before the next blank line
    after its last rule) inside a fenced block."""
    lines: List[str] = text.split("\n")
    out: List[str] = []
    i = 0
    while i < len(lines):
        if RULE.match(lines[i]):
            j = i
            rules = 0
            while j < len(lines) and lines[j].strip():
                rules += bool(RULE.match(lines[j]))
                j += 1
            if rules >= 2:  # a header rule and a closing rule at least
                indent = len(lines[i]) - len(lines[i].lstrip())
                out += ["```text"] + [ln[indent:] if ln[:indent].isspace() else ln for ln in lines[i:j]] + ["```"]
                i = j
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def to_markdown(text: str) -> str:
    """A sinklab docstring with its reStructuredText roles and tables in Markdown."""
    return fence_tables(ROLE.sub(r"`\1`", text))


class RstDocstrings(griffe.Extension):
    """Rewrites every docstring griffe loads (modules, classes, functions, attributes)."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
