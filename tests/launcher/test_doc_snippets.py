"""Every shell and Python snippet in README.md and docs/*.md, checked against the code,
so the docs cannot drift from it (issue #30).

Each fenced block carries a language (`python`, `sh`/`bash`, or `text`/`mermaid` for
what is not code). A `python` or `sh`/`bash` snippet either runs here, or carries a
marker with its reason on the line right above the fence:

    <!-- snippet: skip, starts a Ray cluster (tens of seconds); tests/ray runs it -->

Every snippet, run or skipped, is checked statically: Python compiles; shell passes
`bash -n`; each repository path it names (examples/..., scripts/..., ...) exists; each
`make` target is in the Makefile; each `hvdrun`/`horovodrun` flag is in `hvdrun --help`;
each `HOROVOD_*` variable is classified in hvd_torch/horovod_env.py and each
`HVD_TORCH_*` variable is read somewhere in the code (those two also in the prose);
each `hvd.<name>` a Python snippet uses, and each inline `hvd.<name>` or
`hvd_torch.<name>` of the prose, is in the package.
A snippet that runs: Python that calls `hvd.init()` through `hvdrun -np 2` (every
rank must exit 0), other Python as one process, shell through `bash -e`, each with a
timeout, in a scratch directory.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_LANGS = {"python": "python", "sh": "sh", "bash": "sh"}
TEXT_LANGS = {"text", "mermaid"}
RUN_TIMEOUT = 90  # seconds per snippet run (2 ranks import torch on a shared 2-core VM)

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*snippet:\s*(\w+)\s*(?:,\s*(.*?))?\s*-->\s*$", re.S)
# Repository paths a snippet names: the top-level folders of this checkout.
_PATH = re.compile(r"(?<![\w./~-])((?:examples|scripts|tests|bench|docs|hvd_torch|hvdrun|"
                   r"ray_integration|csrc)/[\w./-]*[\w/])")
_VARIABLE = re.compile(r"\b((?:HOROVOD|HVD_TORCH)_[A-Z0-9_]*[A-Z0-9])\b")


@dataclasses.dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    lang: str  # "python" or "sh"
    code: str
    skip: str | None  # the marker's reason, None when it runs

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _blocks(path: Path):
    """(line, language, code, marker text or None) per fenced block."""
    text = path.read_text()
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = before if before.lstrip().startswith("<!--") else None
        yield line, m.group(1).strip(), m.group(2), marker


def _snippets() -> list[Snippet]:
    out = []
    for path in DOCS:
        for line, lang, code, marker in _blocks(path):
            if lang not in CODE_LANGS:
                continue
            skip = None
            if marker is not None:
                m = _MARKER.search(marker)
                skip = m.group(2) if m and m.group(1) == "skip" else None
            out.append(Snippet(path, line, CODE_LANGS[lang], code, skip))
    return out


SNIPPETS = _snippets()
IDS = [s.where for s in SNIPPETS]


# ---------------------------------------------------------------- the docs' form


def test_there_are_snippets_and_some_run():
    assert len(SNIPPETS) >= 40, len(SNIPPETS)
    assert sum(s.skip is None for s in SNIPPETS) >= 3


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_fence_names_its_language_and_every_marker_its_reason(path):
    for line, lang, _, marker in _blocks(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        assert lang in CODE_LANGS or lang in TEXT_LANGS, (
            f"{where}: a fence needs a language: python, sh, bash (checked) or text, mermaid")
        if marker is not None and "snippet:" in marker:
            m = _MARKER.search(marker)
            assert m is not None and m.group(1) == "skip", f"{where}: unknown marker {marker!r}"
            assert lang in CODE_LANGS, f"{where}: a marker on a {lang} block"
            reason = (m.group(2) or "").strip()
            assert len(reason.split()) >= 3, f"{where}: a skip needs its reason: {marker!r}"


# ---------------------------------------------------------------- static checks


def _shell_lines(code: str) -> list[list[str]]:
    """Each command line of a shell snippet as words, continuations joined, comments
    dropped."""
    joined = re.sub(r"\\\n", " ", code)
    out = []
    for raw in joined.splitlines():
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:
            continue  # bash -n reports it
        if words:
            out.append(words)
    return out


def _hvdrun_flags(words: list[str]) -> list[str]:
    """The options of every hvdrun/horovodrun call in words (the values skipped, and
    nothing after the command the launcher starts)."""
    from hvdrun import args, launch

    valued = set(launch._VALUED) | set(launch._REPEATED) | set(args.ENGINE_VALUED)
    flags = []
    for i, w in enumerate(words):  # `hvdrun ...`, `python -m hvdrun ...`, `horovodrun ...`
        if os.path.basename(w) not in ("hvdrun", "horovodrun"):
            continue
        j = i + 1
        while j < len(words) and words[j].startswith("-"):
            name, eq, _ = words[j].partition("=")
            flags.append(name)
            j += 2 if name in valued and not eq else 1
    return flags


def _make_targets() -> set[str]:
    """The Makefile's targets; its pattern rule test-% stands for test-<tier>, one per
    tier of tests/conftest.py."""
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))
    if re.search(r"^test-%\s*:", text, re.M):
        tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
        tiers = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and any(getattr(t, "id", "") == "TIERS" for t in n.targets))
        targets |= {f"test-{tier}" for tier in tiers}
    return targets


def _code_text() -> str:
    parts = []
    for folder in ("csrc", "hvd_torch", "hvdrun", "ray_integration", "scripts", "tests/harness",
                   "bench", "examples"):
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in (".py", ".cc", ".h", ".cpp", ".cu", ".sh") and p.is_file():
                parts.append(p.read_text(errors="replace"))
    for name in ("setup.py", "build_config.py", "Makefile", "hvd_torch_autoload.py"):
        parts.append((ROOT / name).read_text())
    return "\n".join(parts)


@pytest.fixture(scope="module")
def code_text():
    return _code_text()


@pytest.mark.parametrize("snippet", SNIPPETS, ids=IDS)
def test_snippet_is_well_formed_and_names_what_exists(snippet, code_text):
    from hvdrun.launch import USAGE

    if snippet.lang == "python":
        compile(snippet.code, snippet.where, "exec")
    else:
        proc = subprocess.run(["bash", "-n"], input=snippet.code, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert proc.returncode == 0, f"{snippet.where}: bash -n: {proc.stderr}"
        targets = _make_targets()
        for words in _shell_lines(snippet.code):
            if words[0] == "make":
                for t in words[1:]:
                    if not t.startswith("-") and "=" not in t:
                        assert t in targets, f"{snippet.where}: no make target {t!r}"
            for flag in _hvdrun_flags(words):
                assert re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", USAGE), (
                    f"{snippet.where}: hvdrun --help has no {flag}")
    for path in _PATH.findall(snippet.code):
        assert (ROOT / path).exists(), f"{snippet.where}: no such file {path}"
    _check_variables(snippet.code, snippet.where, code_text)


def _check_variables(text: str, where: str, code_text: str) -> None:
    from hvd_torch import horovod_env

    known = set(horovod_env.HONOURED) | set(horovod_env.ACCEPTED_VALUES) | set(
        horovod_env.REFUSED)
    for name in set(_VARIABLE.findall(text)):
        if name.startswith("HOROVOD_"):
            # A prefix written for a family (HOROVOD_AUTOTUNE_*, HOROVOD_GPU_...) counts.
            assert name in known or any(k.startswith(name + "_") for k in known), (
                f"{where}: {name} is not in hvd_torch/horovod_env.py")
        else:  # the variable itself, or a family the code reads (NAME_...)
            assert re.search(r"\b" + name + r"(?:_[A-Z0-9_]+)?\b", code_text), (
                f"{where}: no code reads {name}")


def _resolve(dotted: str) -> bool:
    """Whether hvd_torch.<dotted> exists (an attribute, or a submodule)."""
    import importlib

    import hvd_torch

    obj, module = hvd_torch, "hvd_torch"
    for part in dotted.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            module = getattr(obj, "__name__", module) if isinstance(obj, type(hvd_torch)) else None
            continue
        if module is None:
            return False
        try:
            obj = importlib.import_module(f"{module}.{part}")
        except ImportError:
            return False
        module = obj.__name__
    return True


def _hvd_names(code: str) -> set[str]:
    """The dotted names a Python snippet reaches through `hvd.`: hvd.elastic.run, ..."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id == "hvd":
                names.add(".".join(reversed(chain)))
    # Keep only the longest chains (hvd.elastic.run covers hvd.elastic).
    return {n for n in names if not any(m.startswith(n + ".") for m in names)}


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.lang == "python"],
                         ids=[s.where for s in SNIPPETS if s.lang == "python"])
def test_python_snippet_uses_only_hvd_names_that_exist(snippet):
    for name in sorted(_hvd_names(snippet.code)):
        assert _resolve(name), f"{snippet.where}: hvd.{name} does not exist"


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_variables_and_api_named_in_the_prose_exist(path, code_text):
    text = path.read_text()
    where = str(path.relative_to(ROOT))
    _check_variables(text, where, code_text)
    prose = _FENCE.sub("", text)
    for span in re.findall(r"`([^`\n]+)`", prose):
        m = re.fullmatch(r"(?:hvd|hvd_torch)\.([A-Za-z_][\w.]*?)(?:\(.*\))?", span)
        if m:
            assert _resolve(m.group(1)), f"{where}: `{span}`: no such name in hvd_torch"


# ---------------------------------------------------------------- running them

RUNNABLE = [s for s in SNIPPETS if s.skip is None]


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.where for s in RUNNABLE])
def test_snippet_runs(snippet, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if snippet.lang == "python":
        script = tmp_path / "snippet.py"
        script.write_text(snippet.code)
        argv = [sys.executable, str(script)]
        if "init" in _hvd_names(snippet.code):  # a distributed program: 2 ranks
            argv = [sys.executable, "-m", "hvdrun", "-np", "2", *argv]
    else:
        argv = ["bash", "-e", "-c", snippet.code]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)  # fmt: skip
    assert proc.returncode == 0, f"{snippet.where}:\n{proc.stdout}\n{proc.stderr}"
