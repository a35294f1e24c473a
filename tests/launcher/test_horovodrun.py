"""`horovodrun`: hvdrun under Horovod's name (hvdrun/horovodrun.py).

Without Horovod in the environment it is hvdrun: the same arguments reach
hvdrun's main() untouched, with the same output and exit code.  With Horovod
installed too, it is Horovod's own launcher, flags untouched (a stand-in
horovod package on PYTHONPATH plays Horovod here).
"""

import importlib
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hvdrun import horovodrun, launch  # noqa: E402  (standard library only: no torch)


@pytest.fixture
def no_horovod(monkeypatch):
    monkeypatch.setattr(horovodrun, "horovod_launcher", lambda: None)


@pytest.mark.unit
def test_console_script_entry():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["hvdrun"] == "hvdrun.launch:main"
    module, _, function = scripts["horovodrun"].partition(":")
    assert getattr(importlib.import_module(module), function) is horovodrun.main


@pytest.mark.unit
def test_arguments_reach_hvdrun_main_untouched(monkeypatch, no_horovod):
    seen = []
    monkeypatch.setattr(launch, "main", lambda argv: seen.append(argv) or 17)
    argv = ["-np", "4", "-H", "a:2,b:2", "--start-timeout", "60", "-x", "FOO=1",
            "--output-filename", "logs", "python", "train.py", "--lr", "0.1", "-np", "9"]
    assert horovodrun.main(argv) == 17
    monkeypatch.setattr(sys, "argv", ["horovodrun", *argv])
    assert horovodrun.main() == 17  # the console script passes no argv: sys.argv[1:]
    assert seen == [argv, argv]


@pytest.mark.unit
@pytest.mark.parametrize("argv", [
    ["--help"],
    ["-np", "2", "--fusion-threshold-mb", "8", "python", "train.py"],  # refused, not ignored
    ["-np", "2", "--mpi", "python", "train.py"],
    ["-np", "zero", "python", "train.py"],
    ["--no-such-flag"],
])
def test_same_output_and_exit_code_as_hvdrun(argv, capsys, no_horovod):
    want_code = launch.main(argv)
    want = capsys.readouterr()
    got_code = horovodrun.main(argv)
    got = capsys.readouterr()
    assert (got_code, got.out, got.err) == (want_code, want.out, want.err)
    assert want.out or want.err


def _run(module, args, pythonpath=(), timeout=60):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*pythonpath, str(ROOT)]))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=False,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_a_job_through_horovodrun_runs_as_through_hvdrun():
    job = ["-np", "2", sys.executable, "-c",
           "import os, sys; print('rank', os.environ['HOROVOD_RANK']); "
           "sys.exit(3 if os.environ['HOROVOD_RANK'] == '1' else 0)"]
    ours, theirs = _run("hvdrun.horovodrun", job), _run("hvdrun", job)
    assert ours.returncode == theirs.returncode == 3, (ours.stderr, theirs.stderr)
    assert sorted(ours.stdout.splitlines()) == sorted(theirs.stdout.splitlines())
    assert "[0]<stdout>:rank 0" in ours.stdout and "[1]<stdout>:rank 1" in ours.stdout


def test_with_horovod_installed_horovodrun_is_horovods(tmp_path):
    # Horovod's console script is horovod.runner.launch:run_commandline, which
    # reads sys.argv; this stand-in reports what it was given.
    launch_py = tmp_path / "horovod" / "runner" / "launch.py"
    launch_py.parent.mkdir(parents=True)
    (tmp_path / "horovod" / "__init__.py").write_text("")
    (tmp_path / "horovod" / "runner" / "__init__.py").write_text("")
    launch_py.write_text(textwrap.dedent("""\
        import json, sys

        def run_commandline():
            print(json.dumps(sys.argv))
            sys.exit(5)
    """))
    args = ["-np", "2", "--fusion-threshold-mb", "8", "python", "train.py"]
    run = _run("hvdrun.horovodrun", args, pythonpath=[str(tmp_path)])
    assert run.returncode == 5, run.stderr
    assert json.loads(run.stdout) == ["horovodrun", *args]
