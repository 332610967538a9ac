#!/usr/bin/env python3
"""Check the relative links of the book (every .md under docs/src) and of README.md.

For every markdown link, image and reference definition whose target is not a web or mail
address: the file or folder it names must exist (relative to the linking file's folder), and
an `#anchor` must name a heading of the markdown file it points into, by mdBook's rule (the
heading's text lowercased, spaces to '-', every other character but letters, digits, '-' and
'_' dropped; a repeated heading gets '-1', '-2', ...). Links inside code are not links.
Also: every chapter SUMMARY.md lists exists, and every .md under docs/src is listed there.

Prints each broken link as `file:line: target: reason` and exits 1 if there is any; else
prints `links: N checked, 0 broken`. Python 3 standard library only.
"""

import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"
SUMMARY = BOOK / "SUMMARY.md"

SKIP = re.compile(r"^(https?:|mailto:)", re.IGNORECASE)
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
# [text](target "title") and ![alt](target), text with at most one level of nested brackets.
INLINE = re.compile(
    r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^>\n]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")


def lines_outside_code(text):
    """(line number, line) for every line not inside a fenced code block; a fence line itself
    is left out too."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and line.strip() == m.group(1):
            fence = None


def plain(heading):
    """A heading's text as it reads: links and images to their text, code to its content,
    HTML tags dropped."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.strip()


def slug(heading):
    out = []
    for ch in plain(heading):
        if ch.isalnum() or ch in "-_":
            out.append(ch.lower() if ch.isascii() else ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(path, cache={}):
    """The anchors mdBook gives the headings of a markdown file."""
    if path not in cache:
        seen = {}
        ids = set()
        previous = ""
        for _, line in lines_outside_code(path.read_text(encoding="utf-8")):
            text = None
            m = ATX.match(line)
            if m:
                text = re.sub(r"\s+#+\s*$", "", m.group(2) or "")
            elif SETEXT.match(line) and previous.strip() and not previous.lstrip().startswith(("|", "-", "*", ">")) \
                    and not ATX.match(previous):
                text = previous.strip()
            if text is not None:
                base = slug(text)
                count = seen.get(base, 0)
                ids.add(base if count == 0 else f"{base}-{count}")
                seen[base] = count + 1
            previous = line
        cache[path] = ids
    return cache[path]


def targets(text):
    """(line number, target) of every link, image and reference definition outside code."""
    for number, line in lines_outside_code(text):
        m = REFERENCE.match(line)
        if m:
            yield number, m.group(1)
            continue
        line = CODE_SPAN.sub(lambda c: " " * len(c.group(0)), line)
        for m in INLINE.finditer(line):
            yield number, m.group(1)


def check(md, target):
    """Why a relative link is broken, or None."""
    target = target.strip()
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part)
    if path_part.startswith("/"):
        return "absolute path: write it relative to the file"
    dest = (md.parent / path_part).resolve() if path_part else md
    if not dest.exists():
        return "no such file or folder"
    if anchor:
        if dest.is_dir() or dest.suffix != ".md":
            return "an anchor into something that is not a markdown file"
        if unquote(anchor) not in anchors(dest):
            return f"no heading with anchor #{anchor} in {rel(dest)}"
    return None


def rel(path):
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def summary_chapters():
    """(line number, target) of every chapter SUMMARY.md lists."""
    for number, target in targets(SUMMARY.read_text(encoding="utf-8")):
        yield number, target


def main():
    files = sorted(BOOK.rglob("*.md")) + [ROOT / "README.md"]
    broken = []
    checked = 0
    for md in files:
        text = md.read_text(encoding="utf-8")
        for number, target in targets(text):
            if SKIP.match(target.strip("<>")):
                continue
            checked += 1
            reason = check(md, target)
            if reason:
                broken.append(f"{rel(md)}:{number}: {target}: {reason}")

    if not SUMMARY.exists():
        broken.append(f"{rel(SUMMARY)}:0: SUMMARY.md: the book has no SUMMARY.md")
    else:
        listed = set()
        for number, target in summary_chapters():
            path_part = unquote(target.partition("#")[0])
            if not path_part:
                continue
            dest = (BOOK / path_part).resolve()
            listed.add(dest)
            if not dest.is_file():
                broken.append(f"{rel(SUMMARY)}:{number}: {target}: chapter does not exist")
        for md in sorted(BOOK.rglob("*.md")):
            if md.resolve() != SUMMARY.resolve() and md.resolve() not in listed:
                broken.append(f"{rel(md)}:1: {rel(md)}: not listed in {rel(SUMMARY)}")

    for line in broken:
        print(line)
    if broken:
        print(f"links: {checked} checked, {len(broken)} broken")
        return 1
    print(f"links: {checked} checked, 0 broken")
    return 0


if __name__ == "__main__":
    sys.exit(main())
