"""The project's files describe the product, not the story of its making (docs/architecture.md,
"Docs and comments"): no periods of work, tracker numbers, branch names or "was X, now Y" in docs,
code or tests; docs/benchmarks.md states today's figures in a few hundred lines; every pointer
from the code to a section of docs/benchmarks.md names a section that exists; and every pointer to a
doc (`docs/name.md#anchor`, a Markdown link `](name.md#anchor)`) names a doc and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: Where the project speaks: docs, the platform, the node client, the tests, the benchmarks.
ROOTS = ["README.md", "docs", "platform", "node_client", "tests", "bench"]
SUFFIXES = {".py", ".md", ".html", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".js", ".css", ".c", ".sh"}

_ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))"
)
#: A period of work named as one ("the ninth session", "this session's machine"), a tracker's number
#: ("issue 11", "tracker issue 3"), a branch ("branch `ingest2`"), a change told as history.
DIARY = {
    "a period of work": re.compile(
        rf"\b{_ORDINAL}\s+(?:work\s+)?session\b"
        r"|\b(?:this|that|previous|last|next|earlier|later|same) session\b(?!\s+(?:fixture|scope))"
        r"|\b(?:earlier|previous|later|other) sessions\b",
        re.IGNORECASE,
    ),
    "a tracker number": re.compile(r"\b(?:issue|tracker|ticket)\s*#?\s*\d+", re.IGNORECASE),
    "a branch name": re.compile(r"\bbranch(?:es)?\s+`|\bissue-\d+\b", re.IGNORECASE),
    "was X, now Y": re.compile(r"\bwas\b[^.;\n]{0,60}[,;]\s*now\b", re.IGNORECASE),
}
BENCHMARKS = REPO / "docs" / "benchmarks.md"
#: `docs/benchmarks.md, "Section"`, the quote possibly on the next comment line.
_POINTER = re.compile(r'docs/benchmarks\.md,?(?:\s|#:?)*"([^"]+)"')


def _project_files() -> list[Path]:
    found = []
    for root in ROOTS:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        found += [
            f
            for f in candidates
            if f.is_file() and f.suffix in SUFFIXES and "__pycache__" not in f.parts and f != Path(__file__)
        ]
    return found


FILES = _project_files()


def diary_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, what it tells, the line) for every line of `text` that tells the work's history."""
    return [
        (number, kind, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        for kind, pattern in DIARY.items()
        if pattern.search(line)
    ]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_file_tells_the_history_of_the_work(path):
    found = diary_lines(path.read_text(errors="replace"))
    assert not found, "\n".join(f"{path.relative_to(REPO)}:{n}: {kind}: {line}" for n, kind, line in found)


@pytest.mark.parametrize(
    "text",
    [
        "Measured in the " + "thirteenth session, quiet.",
        "the " + "12th session's machine",
        "as this " + "session found",
        "the targets of issue " + "11",
        "(tracker issue " + "3)",
        "runs on branch `ingest" + "2`",
        "the limit was 10 s, " + "now 60 s",
    ],
)
def test_the_diary_patterns_catch_history(text):
    assert diary_lines(text)


@pytest.mark.parametrize(
    "text",
    [
        "a logged-in session for the user",
        "`live_server` (session scope)",
        "0 dropped sessions",
        "the session statement authenticates",
        "Shared by the whole session",
        "a PostgreSQL restart ends every session",
        "a `truncated` flag per completion",
        "one issue of the paper",
    ],
)
def test_the_diary_patterns_leave_the_product_alone(text):
    assert not diary_lines(text)


def test_the_benchmarks_page_is_reference_sized():
    lines = BENCHMARKS.read_text().splitlines()
    assert len(lines) < 500, f"docs/benchmarks.md has {len(lines)} lines: state today's figures, git log keeps the rest"


def _pointed_sections(text: str) -> list[str]:
    """The section names `text` points to, a name wrapped over lines (and comment markers) read whole."""
    return [re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", name) for name in _POINTER.findall(text)]


def _benchmark_sections() -> set[str]:
    return {line.lstrip("#").strip() for line in BENCHMARKS.read_text().splitlines() if line.startswith("#")}


def test_the_benchmark_sections_the_files_point_to_exist():
    sections = _benchmark_sections()
    stale = [
        f"{path.relative_to(REPO)}: {name!r}"
        for path in FILES
        for name in _pointed_sections(path.read_text(errors="replace"))
        if name not in sections
    ]
    assert not stale, "pointers to sections docs/benchmarks.md does not have:\n" + "\n".join(stale)


def test_the_pointer_pattern_reads_a_pointer_split_over_comment_lines():
    text = '(docs/benchmarks.md, "A share\'s\n    #: fixed cost")'
    assert _pointed_sections(text) == ["A share's fixed cost"]


#: `docs/name.md` with its `#anchor`, anywhere; and a relative Markdown link `](name.md#anchor)`.
_DOC_POINTER = re.compile(r"\bdocs/([\w/.-]+?\.md)(?:#([\w-]+))?")
_DOC_LINK = re.compile(r"\]\(([\w/.-]+?\.md)(?:#([\w-]+))?\)")


def _anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them: lower case, spaces to hyphens,
    other punctuation dropped."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in path.read_text().splitlines()
        if line.startswith("#")
    }


def _doc_pointers(path: Path) -> list[tuple[Path, str]]:
    text = path.read_text(errors="replace")
    found = [(REPO / "docs" / name, anchor) for name, anchor in _DOC_POINTER.findall(text)]
    if path.suffix == ".md":
        found += [(path.parent / name, anchor) for name, anchor in _DOC_LINK.findall(text)]
    return found


def test_the_docs_the_files_point_to_exist():
    stale = [
        f"{path.relative_to(REPO)}: {target.relative_to(REPO) if target.is_relative_to(REPO) else target}"
        + (f"#{anchor}" if anchor else "")
        for path in FILES
        for target, anchor in _doc_pointers(path)
        if not target.resolve().is_file() or (anchor and anchor not in _anchors(target.resolve()))
    ]
    assert not stale, "pointers to docs or headings that do not exist:\n" + "\n".join(stale)


def test_the_anchor_rule_is_github_s():
    doc = REPO / "docs" / "figures.md"
    assert {"cost-nothing-scans-the-pool-per-request", "daily-statistics-export"} <= _anchors(doc)
