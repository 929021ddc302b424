"""The documentation holds together: the README stays a newcomer's page (at most ~300 lines)
and links every page of docs/, every page links back, and every relative link resolves."""

from __future__ import annotations

import re

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def links(path):
    return [m.group(1) for m in LINK.finditer(path.read_text()) if "://" not in m.group(1)]


def test_the_readme_is_short_and_every_page_is_linked_both_ways():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 300
    pages = sorted((ROOT / "docs").glob("*.md"))
    linked = {(ROOT / target).resolve() for target in links(readme)}
    for page in pages:
        if page.name != "README.md":
            assert page.resolve() in linked, f"README.md does not link {page.name}"
            assert "../README.md" in links(page), f"{page.name} does not link back"


def test_every_relative_link_resolves():
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in links(path):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
