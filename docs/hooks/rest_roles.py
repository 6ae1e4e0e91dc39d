"""Griffe extension (mkdocs.yml: mkdocstrings' ``extensions``): the docstrings' Google-style sections render as they
are, but their reStructuredText cross-references (``:class:`~snapvit_pl.Pipeline```, ``:meth:`export```,
``:func:``, ``:data:``, ``:mod:``, ``:attr:``, ...) are no Markdown: the site showed them raw. Each becomes the
name in code, linked to its page where the site documents it (an optional cross-reference of mkdocs-autorefs: a
name the site does not document stays plain code, without a warning)."""
from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: A reST role: ``:role:`target``` or ``:role:`title <target>```, ``~`` showing the last part of the target only.
ROLE = re.compile(r":(?:py:)?(?P<role>class|meth|func|mod|attr|data|obj|exc|const|paramref):"
                  r"`(?P<tilde>~?)(?P<text>[^`<]+?)(?:\s*<(?P<target>[^>`]+)>)?`")


def _identifier(obj: Any, name: str) -> str:
    """The full path of ``name`` as the docstring of ``obj`` means it: resolved in its scope (its module's imports and
    members), the first part of a dotted name first; the name itself when griffe cannot resolve it."""
    name = name.strip().lstrip(".")
    head, _, rest = name.partition(".")
    try:
        resolved = obj.resolve(head)
    except Exception:  # noqa: BLE001 - not in scope (an external name, a parameter): left as written
        return name
    return f"{resolved}.{rest}" if rest else resolved


def markdown(obj: Any, text: str) -> str:
    """``text`` (a docstring) with every reST role as an optional cross-reference around the name in code."""
    def render(match: re.Match) -> str:
        target = (match["target"] or match["text"]).strip()
        shown = target.split(".")[-1] if match["tilde"] else (match["text"].strip() if match["target"] else target)
        if match["role"] in ("meth", "func") and not shown.endswith(")"):
            shown += "()"
        identifier = _identifier(obj, target)
        return (f'<autoref optional identifier="{html.escape(identifier)}"><code>{html.escape(shown)}</code>'
                "</autoref>")

    return ROLE.sub(render, text)


def _walk(obj: Any) -> Any:
    """``obj`` and every object under it (aliases, which point elsewhere, left out)."""
    yield obj
    for member in list(getattr(obj, "members", {}).values()):
        if not getattr(member, "is_alias", False):
            yield from _walk(member)


class RestRoles(griffe.Extension):
    """Rewrites the reST roles of every docstring of a loaded package (:func:`markdown`)."""

    def _rewrite(self, pkg: Any) -> None:
        for obj in _walk(pkg):
            docstring = getattr(obj, "docstring", None)
            if docstring is not None and ROLE.search(docstring.value):
                docstring.value = markdown(obj, docstring.value)

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe >= 2
        self._rewrite(pkg)

    def on_package_loaded(self, *, pkg: Any, **kwargs: Any) -> None:  # griffe < 2
        self._rewrite(pkg)
