"""The documentation holds together: every place that cites a page of docs/
or results/ (code, tests, the README, docs/ and the results pages) names a
file that exists and, with ``#anchor``, a heading of that page; code cites
docs/ anchors, never README sections (the README is a user guide whose
headings may change); README.md stays a short user guide without commit hashes.

Anchors are GitHub's: a heading lowercased, punctuation but ``-`` and ``_``
dropped, spaces turned into ``-``."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 400

# A cited page: docs/x.md or results/.../README.md, optionally #anchor (in code and prose).
CITED = re.compile(r"(?<![\w/.])((?:docs|results)/[\w./-]*?\.md)(?:#([\w-]+))?")
# A Markdown link's target, relative to the page holding it.
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def slug(heading: str) -> str:
    text = heading.strip().replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # not code blocks
    return {slug(h) for h in HEADING.findall(text)}


def broken(root: Path, sources) -> list:
    """(where, citation, why) for every citation in ``sources`` (paths under
    ``root``) whose page or anchor does not exist."""
    out = []
    for src in sources:
        text = src.read_text()
        found = [(m.group(1), m.group(2), root) for m in CITED.finditer(text)]
        if src.suffix == ".md":
            for target in LINK.findall(text):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                path, _, anchor = target.partition("#")
                found.append((path, anchor or None, src.parent))
        for path, anchor, base in found:
            page = (base / path).resolve()
            where = f"{src.relative_to(root)}: {path}{'#' + anchor if anchor else ''}"
            if not page.exists():
                out.append((where, "no such file"))
            elif anchor and page.suffix == ".md" and anchor not in anchors(page):
                out.append((where, "no such heading"))
    return out


def sources(root: Path):
    code = [*root.glob("treespec/**/*.py"), *root.glob("suites/**/*.py"),
            *root.glob("benchmarks/**/*.py"), root / "conftest.py"]
    pages = [root / "README.md", *root.glob("docs/*.md"), *root.glob("results/**/README.md")]
    # This file's own citations are planted examples of broken ones.
    return [p for p in code + pages if p.exists() and p != Path(__file__).resolve()]


def test_slugs_are_githubs():
    assert slug("Contract 7: commit keeps exactly the accepted rows") == \
        "contract-7-commit-keeps-exactly-the-accepted-rows"
    assert slug("Refused, and why") == "refused-and-why"
    assert slug("The CPU's two regimes") == "the-cpus-two-regimes"
    assert slug("Fork / adopt") == "fork--adopt"
    assert slug("Contract 9: greedy text equals `mlx_lm` generate") == \
        "contract-9-greedy-text-equals-mlx_lm-generate"


def test_the_check_finds_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Real heading\n\n[b](b.md#x) [ok](#local)\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n\n```\n## not a heading\n```\n")
    (tmp_path / "m.py").write_text("# docs/a.md#real-heading docs/a.md#gone docs/c.md\n"
                                   "# docs/b.md#not-a-heading\n")
    found = broken(tmp_path, [tmp_path / "m.py", tmp_path / "docs" / "a.md"])
    assert found == [("m.py: docs/a.md#gone", "no such heading"),
                     ("m.py: docs/c.md", "no such file"),
                     ("m.py: docs/b.md#not-a-heading", "no such heading"),
                     ("docs/a.md: b.md#x", "no such heading")]


def test_every_cited_page_and_anchor_exists():
    found = sources(ROOT)
    assert any(p.parts[-2:] == ("evidence", "gate.py") for p in found)  # the tree is read
    assert broken(ROOT, found) == []


def test_code_cites_docs_anchors_not_readme_sections():
    pattern = re.compile(r"""README(?:\.md)?,?\s+["'][A-Z]""")
    code = [p for p in sources(ROOT) if p.suffix == ".py"]
    assert [str(p.relative_to(ROOT)) for p in code if pattern.search(p.read_text())] == []


def test_the_readme_is_a_short_user_guide_without_commit_hashes():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= README_MAX_LINES
    # A commit hash: 7 to 40 hex digits with at least one letter and one digit.
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text)
              if re.search(r"[a-f]", w) and re.search(r"[0-9]", w)]
    assert hashes == []
