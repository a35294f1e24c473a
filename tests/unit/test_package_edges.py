"""The package's edges: no import circle, one spelling of the launcher's modules,
and no reference in code or docs to a file or module that does not exist.

Read from the sources with ast and regular expressions; nothing is imported or run.
docs/plans/ is left out: working notes that name files a plan will create.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hvd_torch", "hvdrun", "ray_integration")
TOPS = ("docs", "hvd_torch", "hvdrun", "ray_integration", "csrc", "tests", "scripts", "bench",
        "examples")
TOP_FILES = ("README.md", "Makefile", "setup.py", "pyproject.toml", "hvd_torch_autoload.py")
SKIPPED = ("docs/plans/",)
OUTPUT_DIRS = {"__pycache__", ".pytest_cache", "results"}  # and build*: what runs write


def _tracked(*suffixes):
    """The repository's own files (relative names) ending in one of suffixes."""
    found = [name for name in TOP_FILES if name.endswith(suffixes)]
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*")):
            name = path.relative_to(ROOT).as_posix()
            if (path.is_file() and name.endswith(suffixes) and not name.startswith(SKIPPED)
                    and not any(part in OUTPUT_DIRS or part.startswith("build")
                                for part in path.relative_to(ROOT).parts[:-1])):
                found.append(name)
    return found


def _module_file(dotted):
    """The file of an internal module or package (a compiled extension counts), or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    if base.parent.is_dir() and any(base.parent.glob(base.name + ".*.so")):
        return base
    return None


def _modules():
    """Internal module name -> its source file."""
    found = {}
    for name in _tracked(".py"):
        parts = Path(name).with_suffix("").parts
        if parts[0] in PACKAGES or name == "hvd_torch_autoload.py":
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = ROOT / name
    return found


def _imports(module, path):
    """(imported internal module, line) for every import in `path`, in functions too.
    `from pkg import name` is an edge to pkg.name when that is a module, else to pkg."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if _module_file(f"{base}.{a.name}") else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES or target == "hvd_torch_autoload":
                yield target, node.lineno


def _graph():
    modules = _modules()
    edges, unresolved = {}, []
    for module, path in modules.items():
        for target, line in _imports(module, path):
            if _module_file(target) is None:
                unresolved.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            elif target != module:
                edges.setdefault(module, {}).setdefault(target, line)
    return edges, unresolved


def _circles(edges):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_our_modules():
    edges, unresolved = _graph()
    assert not unresolved, "imports of modules that do not exist:\n" + "\n".join(unresolved)
    assert sum(len(t) for t in edges.values()) > 150, "the import graph looks truncated"
    described = [
        " <-> ".join(circle) + ": " + "; ".join(
            f"{a} imports {b} (line {edges[a][b]})"
            for a in circle for b in circle if b in edges.get(a, {}))
        for circle in _circles(edges)]
    assert not described, "import circles:\n" + "\n".join(described)


def test_the_circle_finder_finds_a_circle():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _circles(edges) == [["a", "b", "c"]]


def test_the_launchers_modules_have_one_spelling():
    # hvd_torch.runner is only `python -m hvd_torch.runner`; its modules are hvdrun's.
    other = re.compile(r"hvd_torch[./]runner[./]\w|from hvd_torch\.runner import")
    hits = [f"{name}:{n}: {line.strip()}"
            for name in _tracked(".py", ".md", ".sh", ".toml", "Makefile")
            if name != "tests/unit/test_package_edges.py"
            for n, line in enumerate((ROOT / name).read_text().splitlines(), 1)
            if other.search(line)]
    assert not hits, "use hvdrun.<module>:\n" + "\n".join(hits)


EXTS = ("py", "md", "cc", "cpp", "h", "cu", "txt", "toml", "cfg", "sh", "json", "yaml")
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./-]*?\.(?:%s))(?![\w/])"
                  % ("|".join(TOPS), "|".join(EXTS)))
LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)")
OUTPUTS = ("bench/results/",)  # what a run writes (gitignored), named as where to look


def test_every_path_cited_in_code_and_docs_exists():
    missing = []
    for name in _tracked(".py", ".md", ".cc", ".cpp", ".h", ".cu", ".toml", ".txt", ".sh",
                         "Makefile"):
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1):
            cited = [m.group(1).rstrip(".") for m in PATH.finditer(line)]
            if name.endswith(".md"):
                cited += [str((Path(name).parent / m.group(1)).resolve().relative_to(ROOT))
                          for m in LINK.finditer(line)]
            missing += [f"{name}:{n}: {p}" for p in cited
                        if not any(c in p for c in "*<{") and not p.startswith(OUTPUTS)
                        and not (ROOT / p).exists()]
    assert not missing, "cited but not there:\n" + "\n".join(missing)
