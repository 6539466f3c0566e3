"""The docs a newcomer reads: the README (short, pointing at every page) and the pages under docs/,
built as a static site by MkDocs in strict mode; every relative link leads to a file (and to a
heading, where it names one); the HTTP API page's schemas are the service's own."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from modelupgrade.tools import http_schema

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200

# [text](target) outside code: the target up to its closing parenthesis.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def pages() -> list[Path]:
    return sorted(DOCS.glob("**/*.md"))


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code (links there are not links)."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) and GitHub make it, for the headings
    these pages have: code marks and punctuation dropped, lower case, spaces to hyphens."""
    text = unicodedata.normalize("NFKD", heading.replace("`", ""))
    text = text.encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(heading) for heading in HEADING.findall(FENCE.sub("", path.read_text()))}


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` that lead nowhere: no such file, or no such heading."""
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


def nav_pages(config: Path) -> set[str]:
    """The pages ``mkdocs.yml``'s nav lists, at any depth."""

    def walk(entry: object) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in walk(value)]
        if isinstance(entry, list):
            return [page for item in entry for page in walk(item)]
        return []

    return set(walk(yaml.safe_load(config.read_text(encoding="utf-8"))["nav"]))


def test_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """MkDocs in strict mode fails on a broken link or anchor, a page outside the nav, a nav entry
    without a page. Not --quiet: MkDocs 1.6 then drops the warnings before strict mode counts them,
    and a broken link builds."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"]
        + ["--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "http-api.html").exists()


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move the detail into a "
        "page under docs/ and link it"
    )


@pytest.mark.parametrize("path", [README, *pages()], ids=lambda path: path.name)
def test_relative_links_lead_somewhere(path: Path) -> None:
    assert broken_links(path) == []


def test_every_page_is_in_the_nav_and_the_readme() -> None:
    names = {page.relative_to(DOCS).as_posix() for page in pages()}
    assert names, "no pages under docs/"
    assert names - nav_pages(ROOT / "mkdocs.yml") == set(), "pages missing from mkdocs.yml's nav"
    linked = {
        (README.parent / target.partition("#")[0]).resolve().relative_to(DOCS).as_posix()
        for target in links(README)
        if target.startswith("docs/")
    }
    assert names - linked == set(), "pages the README does not point to"


def test_command_table_lists_every_command() -> None:
    from modelupgrade.cli import COMMANDS

    table = re.findall(r"^\| `([a-z-]+)` \|", (DOCS / "commands.md").read_text(), re.MULTILINE)
    assert sorted(COMMANDS) == sorted(table), "docs/commands.md's table and the CLI differ"


def test_http_api_page_holds_the_services_schemas() -> None:
    assert http_schema.page_block() == http_schema.generated(), (
        "docs/http-api.md's schemas differ from the service's: run "
        "python -m modelupgrade.tools.http_schema --write"
    )


def test_link_checks_see_what_is_broken(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing heading and a link inside code."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, with punctuation!\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [web](https://x.org/y)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere)\n"
        "`[in code](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n"
    )
    assert [problem.split(":")[0] for problem in broken_links(page)] == [
        "missing.md",
        "other.md#nowhere",
    ]
