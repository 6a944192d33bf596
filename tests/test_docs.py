"""What the code cites is in the repository: every `docs/<file>` a module, test, script or page names exists
with the sections (§N) it names, and nothing cites a file outside the repository (a clone would hold dead
links)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the repository's own files: not a virtual environment made in the checkout (the README's set-up makes .venv/),
# nor any hidden folder (.git, .whl) or installed package
SOURCES = [p for pattern in ("*.py", "*.md", "*.js") for p in ROOT.rglob(pattern)
           if not any(part.startswith(".") or part in ("results", "site-packages", "node_modules")
                      for part in p.relative_to(ROOT).parts[:-1])]
CITATION = re.compile(r"docs/([\w.-]+\.md)((?:\s*§\d+(?:\s*[-,]\s*§?\d+)*)?)")


def citations():
    for path in SOURCES:
        for m in CITATION.finditer(path.read_text(errors="replace")):
            yield path.relative_to(ROOT), m.group(1), [int(n) for n in re.findall(r"\d+", m.group(2))]


def sections(doc: Path) -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\.", doc.read_text(), flags=re.M)}


def test_every_cited_doc_and_section_exists():
    cited = list(citations())
    assert any(doc == "originals.md" for _, doc, _ in cited)            # the reader finds citations at all
    missing = [f"{where}: docs/{doc} §{n}" for where, doc, numbers in cited
               for n in (numbers or [None])
               if not (ROOT / "docs" / doc).exists() or (n is not None and n not in sections(ROOT / "docs" / doc))]
    assert not missing, "\n".join(missing)


def test_nothing_cites_a_file_outside_the_repository():
    outside = re.compile(r"FACTS\.md|PRODUCTION\.md|\.\./shared|/work/shared")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES if p.name != "test_docs.py"
             for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert not found, "\n".join(found)
