"""The docs as a reference: no word of how the work was organised, and every relative link resolves.

Pure text, no imports of pipeprof: docs/*.md and README.md are read as files, headings turned into anchors
the way GitHub renders them (lower case, punctuation dropped except '-' and '_', spaces to '-', repeats
numbered -1, -2, ...)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# Words of how the work was organised, in that sense only: a product's own "session" (a resumed run) or a third
# party's cited issue ("ray-project/ray #42318") are allowed by the patterns. "Device time" is never allowed: it
# reads as a budget of machines; time a GPU spent is "GPU time" or "time on the GPU".
WORKFLOW = [
    r"\bsessions?\b",
    r"\bissues?\b",
    r"\b(?:one|two|three|four|five|six|\d+) calls\b",
    r"\bone call(?: each|,|\))",
    r"\b\d+-minute call\b",
    r"\bthe call's\b",
    r"\bdevice[- ]time\b",
    r"\bhelpers?\b",
    r"\bthe team\b",
    r"\bengineers?\b",
    r"\breview mends?\b",
]
# A cited issue or pull request of another project: owner/repo #123 or a link to github.com/owner/repo/issues/123.
THIRD_PARTY = re.compile(r"[\w.-]+/[\w.-]+ ?#\d+|github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+")


def anchors(path):
    """The anchors GitHub gives a Markdown file's headings (fenced code skipped)."""
    out, seen, fenced = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"#{1,6} +(.*?) *#* *$", line)
        if m:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            slug = re.sub(r"[^\w\- ]", "", text.lower().replace("`", "")).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def prose(path):
    """The file's lines outside fenced code, with inline code kept (its words are read too)."""
    fenced = False
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_the_docs_say_nothing_of_how_the_work_was_organised(path):
    hits = []
    for i, line in prose(path):
        text = THIRD_PARTY.sub("", line)
        hits += [
            f"{path.name}:{i}: {m.group(0)!r} in {line.strip()[:100]}"
            for p in WORKFLOW
            for m in re.finditer(p, text, re.I)
        ]
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    broken = []
    for i, line in prose(path):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.name}:{i}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.name}:{i}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_cited_measured_anchor_exists():
    have = anchors(ROOT / "docs" / "measured.md")
    files = [*DOCS, *ROOT.joinpath("pipeprof").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]
    files += [*ROOT.joinpath("configs").glob("*.yaml"), *ROOT.joinpath("tests").rglob("*.sh")]
    missing = [
        f"{f.relative_to(ROOT)}: #{a}"
        for f in files
        for a in re.findall(r"measured\.md#([\w-]+)", f.read_text(errors="replace"))
        if a not in have
    ]
    assert have and not missing, "\n".join(missing)


def _plain(text):
    return " ".join(text.replace("`", "").lower().split())


def test_every_section_cited_by_name_exists():
    """A comment or doc citing docs/measured.md, "Some section" finds a heading (or a bold label) holding that name."""
    text = (ROOT / "docs" / "measured.md").read_text()
    names = [_plain(h) for h in re.findall(r"^#{1,6} +(.*)$", text, re.M)]
    names += [_plain(b) for b in re.findall(r"\*\*([^*]+)\*\*", text)]
    files = [*DOCS, *ROOT.joinpath("pipeprof").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]
    files += [*ROOT.joinpath("configs").glob("*.yaml"), *ROOT.joinpath("tests").rglob("*.sh")]
    missing = []
    for f in (f for f in files if f != Path(__file__).resolve()):
        # a citation may wrap onto the next comment or docstring line
        flat = re.sub(r"\s*\n\s*(?:#+\s*)?", " ", f.read_text(errors="replace"))
        for cited in re.findall(r"measured\.md[,:]? *\(?\"([^\"]+)\"", flat):
            if not any(_plain(cited) in n for n in names):
                missing.append(f"{f.relative_to(ROOT)}: {cited!r}")
    assert not missing, "\n".join(missing)
