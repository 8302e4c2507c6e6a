"""The project's documentation is self-contained and its links resolve.

- Every relative link in README.md and docs/ (recursively) points at a file of the repository,
  and a link with an anchor at a heading of that file (GitHub's heading anchors).
- Nothing in the code or the docs cites a document that is not in the repository; design
  decisions are cited by their section of docs/architecture.md.
- Every requirement id the repository cites (FR-15, INV-04, ...) is explained in the glossary
  of docs/architecture.md.

Each check has a negative control: the same checker run on a broken sample reports it.
No servers, no network: plain files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCH_DOC = ROOT / "docs" / "architecture.md"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"!?\[(?:[^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
#: Citations of documents that live outside the repository (a reader of the project cannot open
#: them). Built from pieces so that this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        (
            "ARCHI" + r"TECTURE(\.md)?\s*§",
            r"\.\./" + "sha" + "red",
            r"\bseeds?/",
            r"\bseed[ -]00\d",
            "design " + "card",
        )
    )
)
_REQUIREMENT_ID = re.compile(r"\b(?:UC|FR|NFR|INV|A|AC|STD01)-\d+\b")


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax reduced to its text, lower case, punctuation
    other than '-' and '_' dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        slug = _slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(path: Path, root: Path) -> list[str]:
    """One line per relative link of `path` that does not resolve inside `root`."""
    problems: list[str] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if _SCHEME.match(target):
                continue  # http(s), mailto: not ours to check offline
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not dest.is_relative_to(root):
                problems.append(f"{where}: points outside the repository")
            elif not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor}")
    return problems


def _doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _source_files(root: Path) -> Iterator[Path]:
    """The repository's own .py and .md files (no virtualenv, caches or run directories)."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d for d in dirs if not (d.startswith(".") or d == "__pycache__" or d.endswith("-info"))
        )
        for name in sorted(files):
            if name.endswith((".py", ".md")):
                yield Path(folder) / name


def outside_references(root: Path) -> list[str]:
    """One line per citation of a document outside the repository."""
    problems: list[str] = []
    for path in _source_files(root):
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if _OUTSIDE.search(line):
                problems.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return problems


def glossary_ids(architecture: Path) -> set[str]:
    """The ids the glossary table of docs/architecture.md explains (rows `| ID | meaning |`)."""
    text = architecture.read_text(encoding="utf-8")
    return set(re.findall(r"^\| ((?:UC|FR|NFR|INV|A|AC|STD01)-\d+) \|", text, re.MULTILINE))


def cited_ids(root: Path) -> dict[str, str]:
    """Every requirement id cited in the repository's .py and .md files -> one place citing it."""
    found: dict[str, str] = {}
    for path in _source_files(root):
        if path == Path(__file__).resolve():
            continue  # its negative control cites a made-up id on purpose
        for rid in _REQUIREMENT_ID.findall(path.read_text(encoding="utf-8")):
            found.setdefault(rid, str(path.relative_to(root)))
    return found


# ------------------------------------------------------------------------------------ tests


def test_every_relative_link_in_readme_and_docs_resolves() -> None:
    files = _doc_files(ROOT)
    assert ARCH_DOC in files
    problems = [p for f in files for p in broken_links(f, ROOT)]
    assert problems == []


def test_the_link_checker_reports_a_missing_file_a_missing_anchor_and_an_escape(
    tmp_path: Path,
) -> None:
    """Negative control: the checker above is not vacuous."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## Fencing rule (T >= fence)\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/b.md#fencing-rule-t--fence) [ok too](#top-heading) [web](https://x.test/y)\n"
        "# Top heading\n"
        "[gone](docs/missing.md) [bad anchor](docs/b.md#no-such-heading)\n"
        "[out](../elsewhere/ARCH.md) `[in code](ignored.md)`\n"
        "```\n[in a fence](ignored-too.md)\n```\n"
    )
    problems = broken_links(doc, tmp_path)
    assert len(problems) == 3, problems
    assert "docs/missing.md: no such file" in problems[0]
    assert "no heading with anchor #no-such-heading" in problems[1]
    assert "points outside the repository" in problems[2]


def test_anchors_follow_githubs_rules() -> None:
    assert _slug("Restore procedure (INV-04)") == "restore-procedure-inv-04"
    assert _slug("Grant history (`grant_history(limit=None) -> list`)") == (
        "grant-history-grant_historylimitnone---list"
    )
    assert _slug("Signed grants ([INV-07](x.md))") == "signed-grants-inv-07"


def test_nothing_cites_a_document_outside_the_repository() -> None:
    assert outside_references(ROOT) == []


def test_the_outside_reference_check_catches_each_kind(tmp_path: Path) -> None:
    """Negative control: each kind of outside citation is reported, the in-repository one not."""
    samples = [
        "see ARCHI" + "TECTURE §4",
        "from ../" + "sha" + "red/MISSION.md",
        "see" + "ds/000_x.txt",
        "(seed 001)",
        "the design " + "card's etcd3-py",
    ]
    (tmp_path / "a.md").write_text("\n".join([*samples, "see docs/architecture.md#trust"]))
    assert len(outside_references(tmp_path)) == len(samples)


def test_every_cited_requirement_id_is_in_the_glossary() -> None:
    explained = glossary_ids(ARCH_DOC)
    assert {"FR-15", "INV-04", "A-15", "STD01-06"} <= explained
    missing = {rid: where for rid, where in cited_ids(ROOT).items() if rid not in explained}
    assert missing == {}


def test_the_glossary_check_catches_an_unexplained_id(tmp_path: Path) -> None:
    """Negative control: an id cited but not in the glossary is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("| FR-01 | one holder |\n")
    (tmp_path / "code.py").write_text('"""Refuses a stale token (FR-01, FR-99)."""\n')
    explained = glossary_ids(tmp_path / "docs" / "architecture.md")
    assert {r for r in cited_ids(tmp_path) if r not in explained} == {"FR-99"}
