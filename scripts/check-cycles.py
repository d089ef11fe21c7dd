#!/usr/bin/env python3
"""Fails when the code of a crate imports in a circle.

usage: scripts/check-cycles.py [SRC_DIR...]   (default: model/src data/src train/src)

Every `.rs` file is a module (`mod.rs`, `lib.rs` and `main.rs` stand for their folder). A
file depends on each module it names through a `crate::` or `super::` path, in a `use`
line or inline: the path resolves to the longest module that exists. A module naming its
own submodules is how Rust nests code and does not count; every other dependency does,
including a child's on its parent. The check looks at files, and at modules cut to their
first and to their first two names (`hla`, `hla::cpu`): a cycle at any of these levels
fails, with the modules that form it. Prints "no cycles" and exits 0 otherwise.
"""
import graphlib
import re
import sys
from pathlib import Path

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\])*"')
USE = re.compile(r"\buse\s+([^;]+);")
INLINE = re.compile(r"(?<![\w:])((?:crate|super)(?:::\w+)+)")


def module_of(src: Path, file: Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def use_paths(tree: str) -> list:
    """`a::{b, c::{d}}` → `a::b`, `a::c::d` (renames and globs dropped)."""
    tree = re.sub(r"\s+", "", tree)
    depth, start, items = 0, 0, []
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"as\w+$", "", tree).rstrip(":*")]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    for i, ch in enumerate(inner + ","):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            if inner[start:i]:
                items += [prefix + p for p in use_paths(inner[start:i])]
            start = i + 1
    return items


def resolve(modules: set, here: tuple, path: str):
    names = [n for n in path.split("::") if n]
    if not names or names[0] not in ("crate", "super", "self"):
        return None
    base = () if names[0] == "crate" else here
    names = names[1:] if names[0] == "crate" else names
    while names and names[0] in ("super", "self"):
        base = base[:-1] if names.pop(0) == "super" else base
    found = None
    for i in range(len(names) + 1):
        if base + tuple(names[:i]) in modules:
            found = base + tuple(names[:i])
    return found


def dependencies(src: Path) -> dict:
    files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
    graph = {m: set() for m in files}
    for here, file in files.items():
        code = STRING.sub('""', COMMENT.sub("", file.read_text(encoding="utf-8")))
        paths = [p for tree in USE.findall(code) for p in use_paths(tree)]
        paths += INLINE.findall(code)
        for path in paths:
            target = resolve(set(files), here, path)
            if target is not None and target[: len(here)] != here:
                graph[here].add(target)
    return graph


def cycle(graph: dict):
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def levels(graph: dict):
    yield "files", graph
    for depth in (1, 2):
        cut = {}
        for a, targets in graph.items():
            for b in targets:
                if a[:depth] and b[:depth] and a[:depth] != b[:depth]:
                    cut.setdefault(a[:depth], set()).add(b[:depth])
        yield f"modules at depth {depth}", cut


def main(dirs: list) -> int:
    failed = False
    for src in map(Path, dirs or ["model/src", "data/src", "train/src"]):
        for level, graph in levels(dependencies(src)):
            found = cycle(graph)
            if found:
                failed = True
                names = " -> ".join("::".join(m) or "(crate root)" for m in found)
                print(f"{src}: a cycle between {level}: {names}")
    if not failed:
        print("no cycles")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
