#!/usr/bin/python3
"""Import edges among hvd_torch/, hvdrun/, ray_integration/ (issue #46 analysis).

Static: parses every .py file with ast, records each `import` / `from ... import`
(module level, inside functions, inside try/if), resolves relative imports and
`from pkg import submodule`, and reports
  - every pair of modules that import each other (directly),
  - every strongly connected component (longer circles),
  - the same with hvd_torch.runner.X folded onto hvdrun.X (the sys.modules alias),
  - with and without edges to a package's own __init__ (parent package).
Run from the repository root: /usr/bin/python3 /work/notes/issue46_import_cycles.py
"""

import ast
import os
import sys

ROOTS = ("hvd_torch", "hvdrun", "ray_integration")


def module_files(repo):
    mods = {}
    for root in ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(repo, root)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(".so"):  # an extension (hvd_torch._C): a leaf module
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, repo).split(".")[0].split(os.sep)
                    mods[".".join(rel)] = path
                    continue
                if not f.endswith(".py"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, repo)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join(rel)] = path
    return mods


def is_package(mods, name):
    p = mods.get(name)
    return p is not None and p.endswith("__init__.py")


class Visitor(ast.NodeVisitor):
    def __init__(self, mod, is_pkg):
        self.mod, self.is_pkg = mod, is_pkg
        self.depth = 0  # >0: inside a function
        self.found = []  # (target, lineno, in_function)

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((a.name, None, node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node):
        base = node.module or ""
        if node.level:
            pkg = self.mod.split(".") if self.is_pkg else self.mod.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        for a in node.names:
            self.found.append((base, a.name, node.lineno, self.depth > 0))


def edges(repo, fold_alias):
    mods = module_files(repo)
    out = {}  # (src, dst) -> [(line, in_function)]
    for mod, path in mods.items():
        if path.endswith(".so"):
            continue
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        v = Visitor(mod, path.endswith("__init__.py"))
        v.visit(tree)
        for base, name, line, in_fn in v.found:
            cands = []
            if name is not None and f"{base}.{name}" in mods:
                cands.append(f"{base}.{name}")  # from pkg import submodule
            elif base in mods:
                cands.append(base)
            else:  # import a.b.c where only a.b exists, etc.
                parts = base.split(".")
                while parts and ".".join(parts) not in mods:
                    parts.pop()
                if parts:
                    cands.append(".".join(parts))
            for dst in cands:
                src = mod
                if fold_alias:
                    src = src.replace("hvd_torch.runner.", "hvdrun.")
                    dst = dst.replace("hvd_torch.runner.", "hvdrun.")
                if dst == src:
                    continue
                out.setdefault((src, dst), []).append((line, in_fn))
    return mods, out


def sccs(nodes, adj):
    index, low, stack, on, res, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj.get(v, ()):
            if w not in index:
                strong(w)
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
                res.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return res


def report(repo, fold_alias, skip_parent):
    mods, e = edges(repo, fold_alias)
    if skip_parent:  # an import of one's own package's __init__ (or an ancestor)
        e = {k: v for k, v in e.items() if not k[0].startswith(k[1] + ".")}
    adj = {}
    for s, d in e:
        adj.setdefault(s, set()).add(d)
    title = f"alias folded={fold_alias}, edges to own package __init__ skipped={skip_parent}"
    print(f"== {title}: {len(e)} edges")
    pairs = sorted({tuple(sorted(k)) for k in e if (k[1], k[0]) in e})
    print(f"-- mutual pairs: {len(pairs)}")
    for a, b in pairs:
        fa = ", ".join(f"{l}{'(fn)' if f else ''}" for l, f in e[(a, b)])
        fb = ", ".join(f"{l}{'(fn)' if f else ''}" for l, f in e[(b, a)])
        print(f"   {a} -> {b} [lines {fa}]   |   {b} -> {a} [lines {fb}]")
    comps = sccs(set(mods) | {d for _, d in e}, adj)
    print(f"-- strongly connected components (circles of any length): {len(comps)}")
    for c in comps:
        print("   " + " <-> ".join(c))


if __name__ == "__main__":
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    for fold in (False, True):
        for skip in (True, False):
            report(repo, fold, skip)
