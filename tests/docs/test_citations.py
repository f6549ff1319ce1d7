"""The project documents itself: every citation in the code, tests, deployment files and READMEs
resolves inside the repository (docs/README.md).

- every clause id cited (RF-xx, DPS-xx, GS-xx, QE-xx, in text or in a test's name) is defined by a
  heading in docs/;
- every `docs/...` path cited exists, and a section named after it ("docs/x.md, "Section"") is a
  heading of that page; every relative link between the docs pages lands on a page and an anchor;
- nothing cites what a reader of the repository does not have: numbered sections of an outside
  reference, spec files, ADRs, architecture or convention notes kept elsewhere.

Pure file reading: no server, no timing."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "libs", "deploy", "tests", "bench", ".ci")
TOP_FILES = ("README.md", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".tpl", ".toml", ".txt", ".sh", ".json", ".cfg", ".ini"}
SKIPPED_DIRS = {"node_modules", "__pycache__", ".venv", ".local", ".pytest_cache", ".mypy_cache"}

CLAUSE = re.compile(r"\b(?P<kind>RF|DPS|GS|QE)-(?P<number>\d\d)\b")
CLAUSE_TEST_NAME = re.compile(r"\bdef test_(?P<kind>rf|dps|gs|qe)(?P<number>\d\d)_\w*", re.IGNORECASE)
CLAUSE_HEADING = re.compile(r"^#{2,4} +((?:RF|DPS|GS|QE)-\d\d)\b", re.MULTILINE)
DOCS_PATH = re.compile(r"\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")
# `docs/page.md, "Section"` (the path possibly in backticks): the section must be a heading there
DOCS_SECTION = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)`?,\s*\"([^\"]{1,80})\"")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)
# what a user of the repository does not have; assembled from parts so this file does not cite it
FORBIDDEN = {
    "a numbered section of an outside reference": re.compile("\u00a7"),
    "a spec file": re.compile(r"\bspec/|dataspace-row-filters\.md|dps-data-plane\.md"),
    "the outside reference notes": re.compile(r"\breference/|original-data-plane|local-infrastructure\.md"),
    "an ADR": re.compile(r"\bADR-\d"),
    "an architecture or conventions note kept elsewhere": re.compile("ARCHITECT" + "URE|CONVENT" + "IONS"),
    "the gateway interface note": re.compile("GATEWAY_" + "INTERFACE"),
    "prior-art designs": re.compile("prior" + "-art"),
    "the shared folder beside the repository": re.compile(r"\.\./shared\b"),
}


def source_files(root: Path) -> Iterator[Path]:
    """Every text file outside docs/ that may carry a citation (this test module excepted)."""
    me = Path(__file__).resolve()
    for top in TOP_FILES:
        if (root / top).is_file():
            yield root / top
    for folder in SCANNED:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if SKIPPED_DIRS.intersection(path.relative_to(root).parts) or not path.is_file():
                continue
            if (path.suffix in SUFFIXES or path.name == "Dockerfile") and path.resolve() != me:
                yield path


def doc_files(root: Path) -> list[Path]:
    return sorted((root / "docs").glob("*.md"))


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's rules) gives a heading."""
    text = re.sub(r"[`*_]|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def defined_clauses(root: Path) -> set[str]:
    return {m.group(1) for doc in doc_files(root) for m in CLAUSE_HEADING.finditer(read(doc))}


def matches(
    root: Path,
    paths: Iterable[Path],
    pattern: re.Pattern[str],
    bad: Callable[[re.Match[str]], bool],
    show: Callable[[re.Match[str]], str] = lambda m: m.group(0),
) -> list[str]:
    """`path:line: what` of every match of `pattern` in `paths` that `bad` holds for."""
    return [
        f"{path.relative_to(root)}:{line_of(text, m.start())}: {show(m)}"
        for path in paths
        for text in [read(path)]
        for m in pattern.finditer(text)
        if bad(m)
    ]


def clause_of(m: re.Match[str]) -> str:
    kind, number = m.group("kind"), m.group("number")
    return f"{kind.upper()}-{number}"


def undefined_clause_citations(root: Path) -> list[str]:
    defined = defined_clauses(root)
    found = [
        hit
        for pattern in (CLAUSE, CLAUSE_TEST_NAME)
        for hit in matches(
            root, source_files(root), pattern, lambda m: clause_of(m) not in defined, clause_of
        )
    ]
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1])))


def broken_docs_paths(root: Path) -> list[str]:
    return matches(root, source_files(root), DOCS_PATH, lambda m: not (root / m.group(0)).exists())


def headings(doc: Path) -> list[str]:
    return [h.lower() for h in HEADING.findall(read(doc))]


def broken_docs_sections(root: Path) -> list[str]:
    """`docs/page.md, "Section"`: some heading of that page starts with the quoted words."""

    def bad(m: re.Match[str]) -> bool:
        page = root / "docs" / m.group(1)
        words = " ".join(m.group(2).split()).lower()
        return not page.is_file() or not any(h.startswith(words) for h in headings(page))

    return matches(root, source_files(root), DOCS_SECTION, bad)


def link_lands(doc: Path, target: str) -> bool:
    if re.match(r"[a-z]+:", target):
        return True  # an absolute URL: not ours to check here
    page, _, anchor = target.partition("#")
    dest = (doc.parent / page).resolve() if page else doc
    if not dest.exists():
        return False
    return not anchor or (dest.is_file() and anchor in {slug(h) for h in HEADING.findall(read(dest))})


def broken_doc_links(root: Path) -> list[str]:
    """Relative links between docs pages: the page exists, and so does the anchor."""
    found = []
    for doc in doc_files(root):
        found += matches(root, [doc], MD_LINK, partial(link_broken, doc), lambda m: m.group(1))
    return found


def link_broken(doc: Path, m: re.Match[str]) -> bool:
    return not link_lands(doc, m.group(1))


def named(what: str, _m: re.Match[str]) -> str:
    return what


def outside_citations(root: Path) -> list[str]:
    paths = [*source_files(root), *doc_files(root)]
    found = []
    for what, pattern in FORBIDDEN.items():
        found += matches(root, paths, pattern, lambda m: True, partial(named, what))
    return found


def test_every_cited_clause_id_is_defined_in_docs() -> None:
    assert defined_clauses(ROOT), "docs/ defines no clause at all"
    assert undefined_clause_citations(ROOT) == []


def test_every_cited_docs_path_exists() -> None:
    assert broken_docs_paths(ROOT) == []


def test_every_cited_docs_section_is_a_heading_of_its_page() -> None:
    assert broken_docs_sections(ROOT) == []


def test_links_between_docs_pages_land() -> None:
    assert broken_doc_links(ROOT) == []


def test_nothing_cites_what_the_repository_does_not_hold() -> None:
    assert outside_citations(ROOT) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A tiny repository with one good citation of each kind and one bad one of each kind."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "row-filters.md").write_text(
        "# Row filters\n\n## Two phases\n\n### RF-05 — Empty means nothing\n\n[up](missing.md) "
        "[here](#two-phases) [nowhere](#no-such-heading)\n",
        encoding="utf-8",
    )
    src = tmp_path / "services" / "svc"
    src.mkdir(parents=True)
    (src / "mod.py").write_text(
        '"""Narrowing (RF-05; docs/row-filters.md, "Two phases"). Also RF-99, docs/nowhere.md,\n'
        'docs/row-filters.md, "No such section", reference \u00a71.3 and the spec/x.md file."""\n\n\n'
        "def test_gs42_named_after_an_undefined_clause() -> None:\n    pass\n",
        encoding="utf-8",
    )
    return tmp_path


def test_the_checks_catch_planted_bad_citations(planted: Path) -> None:
    assert undefined_clause_citations(planted) == [
        "services/svc/mod.py:1: RF-99",
        "services/svc/mod.py:5: GS-42",
    ]
    assert broken_docs_paths(planted) == ["services/svc/mod.py:1: docs/nowhere.md"]
    assert broken_docs_sections(planted) == ['services/svc/mod.py:2: docs/row-filters.md, "No such section"']
    assert broken_doc_links(planted) == [
        "docs/row-filters.md:7: missing.md",
        "docs/row-filters.md:7: #no-such-heading",
    ]
    assert outside_citations(planted) == [
        "services/svc/mod.py:2: a numbered section of an outside reference",
        "services/svc/mod.py:2: a spec file",
    ]
