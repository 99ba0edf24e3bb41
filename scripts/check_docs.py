#!/usr/bin/env python3
"""Checks the documentation a newcomer walks (stdlib only; run from anywhere).

1. Every relative link in README.md, ARCHITECTURE.md, CONTRIBUTING.md and docs/**/*.md resolves
   to a file or directory inside the repository; a `#anchor` into a markdown file (or into the
   same file) matches one of its headings as GitHub slugs them (or an explicit `id`/`name`).
2. The README's quick start (the fenced block between `<!-- quick-start` and
   `<!-- /quick-start -->`) holds exactly two commands: the one that runs the gateway, and the
   test command, which must be the very command `.ci/run` execs.

Prints every problem as `file:line: message` and exits 1 when there is any.
"""

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The command that runs the gateway on its embedded defaults, as the README has always given
# it. Changing it is a deliberate act: change it here too.
RUN_COMMAND = "cargo run --release -- serve"
QUICK_START_OPEN = "<!-- quick-start"
QUICK_START_CLOSE = "<!-- /quick-start -->"

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files():
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "CONTRIBUTING.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            marker = m.group(1)
            if fence is None:
                fence = marker[0] * len(marker)
                continue
            if marker.startswith(fence):
                fence = None
                continue
        if fence is None:
            yield n, line


def slug(heading):
    """The anchor GitHub gives a heading: markup dropped, lowercased, punctuation removed
    (letters, digits, `-`, `_` and spaces kept), spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # emphasis underscores, not snake_case
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in "-_" or ch == " " or cat[0] in "LN" or cat == "Mn":
            out.append("-" if ch == " " else ch)
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        seen = {}
        found = set()
        text = path.read_text(encoding="utf-8")
        for _, line in prose_lines(text):
            for name in HTML_ANCHOR.findall(line):
                found.add(name)
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links(text):
    """(line number, target) of every link outside code blocks and code spans."""
    for n, line in prose_lines(text):
        bare = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(bare):
            yield n, m.group(1)
        m = REF_DEF.match(bare)
        if m:
            yield n, m.group(1)


def check_links(problems):
    for doc in doc_files():
        rel_doc = doc.relative_to(ROOT)
        for n, target in links(doc.read_text(encoding="utf-8")):
            target = target.strip("<>")
            if SCHEME.match(target) or target.startswith("//"):
                continue  # absolute URLs are not checked here
            where = f"{rel_doc}:{n}"
            path_part, _, anchor = target.partition("#")
            if path_part:
                if path_part.startswith("/"):
                    problems.append(f"{where}: {target}: absolute path (links must be relative)")
                    continue
                dest = (doc.parent / path_part).resolve()
                try:
                    dest.relative_to(ROOT)
                except ValueError:
                    problems.append(f"{where}: {target}: leaves the repository")
                    continue
                if not dest.exists():
                    problems.append(f"{where}: {target}: no such file or directory")
                    continue
            else:
                dest = doc
            if anchor and dest.is_file() and dest.suffix == ".md":
                if anchor not in anchors(dest):
                    problems.append(
                        f"{where}: {target}: no heading with the anchor #{anchor} in "
                        f"{dest.relative_to(ROOT)}"
                    )


def ci_command():
    """The command `.ci/run` execs."""
    run = ROOT / ".ci" / "run"
    for line in run.read_text(encoding="utf-8").split("\n"):
        line = line.strip()
        if line.startswith("exec "):
            return " ".join(line[len("exec "):].split())
    return None


def check_quick_start(problems):
    readme = ROOT / "README.md"
    lines = readme.read_text(encoding="utf-8").split("\n")
    opens = [i for i, l in enumerate(lines) if l.strip().startswith(QUICK_START_OPEN)]
    closes = [i for i, l in enumerate(lines) if l.strip() == QUICK_START_CLOSE]
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        problems.append(
            f"README.md:1: the quick start must be one block between `{QUICK_START_OPEN} ...-->` "
            f"and `{QUICK_START_CLOSE}`"
        )
        return
    start = opens[0]
    block = lines[start + 1 : closes[0]]
    commands = []
    in_fence = False
    for offset, line in enumerate(block, start + 2):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            command = " ".join(line.split("#", 1)[0].split())
            if command:
                commands.append((offset, command))
        elif line.strip():
            problems.append(f"README.md:{offset}: only a fenced code block belongs in the quick start")
    expected = ci_command()
    if expected is None:
        problems.append(".ci/run:1: no `exec <command>` line found")
        return
    wanted = [RUN_COMMAND, expected]
    got = [c for _, c in commands]
    if got != wanted:
        line = commands[0][0] if commands else start + 1
        problems.append(
            f"README.md:{line}: the quick start commands are {got}, expected {wanted} "
            f"(the run command, then the test command `.ci/run` execs)"
        )


def main():
    problems = []
    check_links(problems)
    check_quick_start(problems)
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_docs: {len(doc_files())} files, links and quick start ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
