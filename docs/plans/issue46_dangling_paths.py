#!/usr/bin/python3
"""Paths cited in tracked code and docs that do not exist (issue #46 analysis).

Looks for repository-relative path mentions (`docs/x.md`, `hvd_torch/a/b.py`,
`csrc/.../f.cc`, `tests/...`, `scripts/...`, `bench/...`, `examples/...`) in every
tracked text file except vendored ones, and relative markdown links in docs/
(`(gpu.md)`, `(toolbox.md#installing)`), and reports those missing in the tree.
Run from the repository root.
"""

import os
import re
import subprocess
import sys

TOPS = ("docs", "hvd_torch", "hvdrun", "ray_integration", "csrc", "tests", "scripts", "bench",
        "examples")
EXTS = ("py", "md", "cc", "cpp", "h", "cu", "txt", "toml", "cfg", "sh", "json", "yaml")
PATH_RE = re.compile(r"(?<![\w/.-])((?:%s)/[\w./-]*?\.(?:%s))(?![\w/])" % ("|".join(TOPS),
                                                                       "|".join(EXTS)))
LINK_RE = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)")


def main(repo):
    files = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True,
                           check=True).stdout.split()
    missing = {}
    for f in files:
        if f.startswith((".venv", "third_party")) or not f.endswith(
                (".py", ".md", ".cc", ".cpp", ".h", ".cu", ".toml", ".txt", ".sh", "Makefile")):
            continue
        try:
            text = open(os.path.join(repo, f), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in PATH_RE.finditer(line):
                p = m.group(1).rstrip(".")
                if "*" in p or "<" in p or "{" in p:
                    continue
                if not os.path.exists(os.path.join(repo, p)):
                    missing.setdefault(p, []).append(f"{f}:{n}")
            if f.endswith(".md"):
                for m in LINK_RE.finditer(line):
                    target = os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))
                    if not os.path.exists(os.path.join(repo, target)):
                        missing.setdefault(target, []).append(f"{f}:{n}")
    for p in sorted(missing):
        where = missing[p]
        print(f"{p}: {len(where)} mention(s): {', '.join(where[:6])}{' ...' if len(where) > 6 else ''}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")


# Dotted references (`hvd_torch.runner.store.KVStoreServer`, `hvdrun.env.horovod_env`)
# in docs and code: the longest prefix that is a module file, then the next name must
# be defined at that module's top level (def, class, assignment, import) or be a
# submodule. hvd_torch.runner.X is read as hvdrun.X (the sys.modules alias).
DOTTED_RE = re.compile(r"(?<![\w.])((?:hvd_torch|hvdrun|ray_integration)(?:\.\w+)+)")


def _module_path(repo, parts):
    base = os.path.join(repo, *parts)
    for p in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.exists(p):
            return p
    return None


def _top_names(path):
    import ast
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
    return names


def dotted(repo):
    files = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True,
                           check=True).stdout.split()
    bad = {}
    for f in files:
        if not f.endswith((".py", ".md")) or f.startswith(".venv"):
            continue
        text = open(os.path.join(repo, f), encoding="utf-8").read()
        for n, line in enumerate(text.splitlines(), 1):
            for m in DOTTED_RE.finditer(line):
                parts = m.group(1).split(".")
                if parts[:2] == ["hvd_torch", "runner"] and len(parts) > 2:
                    parts = ["hvdrun"] + parts[2:]
                if parts[-1] in ("py", "md", "so"):
                    continue
                k = len(parts)
                while k > 0 and _module_path(repo, parts[:k]) is None:
                    k -= 1
                if k == 0 or k == len(parts):
                    continue
                name = parts[k]
                if name.startswith("_C") or name == "ops" and parts[0] == "torch":
                    continue
                if name not in _top_names(_module_path(repo, parts[:k])):
                    bad.setdefault(m.group(1), []).append(f"{f}:{n}")
    for p in sorted(bad):
        print(f"dotted {p}: {', '.join(bad[p][:5])}")


if __name__ == "__main__":
    dotted(sys.argv[1] if len(sys.argv) > 1 else ".")
