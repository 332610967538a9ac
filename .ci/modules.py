#!/usr/bin/env python3
"""Check the module structure of the crates named on the command line (their `src/` folders):
no import circles among their modules, and no file of non-test code over the line limit.

An edge A -> B is a `use crate::…`, `use super::…` or inline `crate::…` path in module A that
names an item of module B. Names a module re-exports (`pub use b::X`) count as B's, so a facade
`mod.rs` is never a link of a circle by itself. Test modules (`#[cfg(test)]` and the files they
live in) are left out, and so is a library's `src/bin/` (name a binary's folder to check it).
Exit status 1 when anything is wrong.
"""

import re
import sys
from pathlib import Path

LINE_LIMIT = 600


def module_of(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(text: str) -> str:
    """The file without its `#[cfg(test)]` module and comments."""
    # An inline test module (`mod tests {`); a declaration `mod tests;` names a file left out.
    m = re.search(r"#\[cfg\(test\)\]\s*mod tests\s*\{", text)
    if m:
        text = text[: m.start()]
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def use_trees(code: str):
    """Each `use …;` statement, with `pub use` marked."""
    for m in re.finditer(r"(pub(?:\([a-z]+\))?\s+)?use\s+([^;]+);", code):
        yield bool(m.group(1)), re.sub(r"\s+", "", m.group(2))


def expand(tree: str) -> list:
    """`a::{b, c::{d, e}}` as the paths a::b, a::c::d, a::c::e."""
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree.split("as")[0] if "as" in tree.split("::")[-1] else tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        out.extend(prefix + q for q in expand(p))
    return out


def main() -> int:
    failed = False
    for src in map(Path, sys.argv[1:]):
        # A library's binaries (`src/bin/`) are crates of their own, checked when named.
        files = [
            f
            for f in src.rglob("*.rs")
            if f.name != "tests.rs" and not ((src / "lib.rs").exists() and f.relative_to(src).parts[0] == "bin")
        ]
        modules = {module_of(src, f): f for f in files}
        codes = {m: code_of(f.read_text()) for m, f in modules.items()}
        for m, f in modules.items():
            lines = len(codes[m].splitlines())
            if lines > LINE_LIMIT:
                print(f"{f}: {lines} lines of non-test code (limit {LINE_LIMIT}); split it by concern")
                failed = True
        # Names each module re-exports, and where they come from.
        reexports = {m: {} for m in modules}

        def absolute(here: tuple, path: list) -> list:
            if path[0] == "crate":
                return path[1:]
            out = list(here)
            while path and path[0] in ("super", "self"):
                if path[0] == "super":
                    out = out[:-1]
                path = path[1:]
            return out + path

        def deepest(path: list) -> tuple:
            for n in range(len(path), -1, -1):
                if tuple(path[:n]) in modules:
                    return tuple(path[:n]), path[n:]
            return (), path

        for m in modules:
            for public, tree in use_trees(codes[m]):
                if not public:
                    continue
                for p in expand(tree):
                    segs = p.split("::")
                    if segs[0] not in ("crate", "super", "self") and tuple(list(m) + segs[:1]) not in modules:
                        continue
                    segs = absolute(m, segs) if segs[0] in ("crate", "super", "self") else list(m) + segs
                    target, rest = deepest(segs)
                    if rest:
                        reexports[m][rest[0]] = target

        def resolve(segs: list) -> tuple:
            target, rest = deepest(segs)
            seen = set()
            while rest and rest[0] in reexports.get(target, {}) and target not in seen:
                seen.add(target)
                target = reexports[target][rest[0]]
            return target

        edges = {m: set() for m in modules}
        for m in modules:
            paths = []
            for public, tree in use_trees(codes[m]):
                if not public:
                    paths.extend(expand(tree))
            paths += re.findall(r"(?<![:\w])crate(?:::\w+)+", codes[m])
            for p in paths:
                segs = p.split("::")
                if segs[0] not in ("crate", "super", "self"):
                    continue
                target = resolve(absolute(m, segs))
                if target != m and m[: len(target)] != target:
                    edges[m].add(target)
                elif target != m and len(target) < len(m):
                    # An item of an ancestor module itself (not a re-export): still a dependency.
                    edges[m].add(target)
        # Circles: strongly connected components of more than one module.
        index, low, stack, on, comps = {}, {}, [], set(), []

        def visit(v):
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(comp)

        sys.setrecursionlimit(10000)
        for v in modules:
            if v not in index:
                visit(v)
        for comp in comps:
            names = sorted("::".join(c) or "crate" for c in comp)
            print(f"{src}: import circle among {', '.join(names)}")
            for a in comp:
                for b in sorted(edges[a] & set(comp)):
                    print(f"    {'::'.join(a) or 'crate'} uses {'::'.join(b) or 'crate'}")
            failed = True
        if not comps:
            print(f"{src}: {len(modules)} modules, no import circles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
