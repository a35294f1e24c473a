"""The training examples, run for real on 2 ranks under the launcher, at small sizes.

examples/digits_train.py: trains, checkpoints, resumes from the checkpoint
exactly (same weights as an uninterrupted run) and ignores it with --no-resume;
examples/digits_train_scripted.py: the same with a TorchScript model;
examples/synthetic_benchmark.py: reports local, hvd and ddp throughput;
examples/digits_two_trials.py: two process sets train two models side by side;
examples/digits_elastic.py: finishes under elastic hvdrun.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from hvdrun_job import run_hvdrun  # noqa: E402

EXAMPLES = ROOT / "examples"
# Per run; each takes 5-20 s on 2 busy cores, most of it starting the ranks.
RUN_TIMEOUT = 90
IDENTICAL = re.compile(r"all 2 ranks hold identical weights \(sha256 prefix ([0-9a-f]{16})\)")


def _run_example(script, *args, timeout=RUN_TIMEOUT, np=2):
    """`hvdrun -np NP python examples/<script> args...`; returns (exit code, output)."""
    code, out, _ = run_hvdrun(["-np", str(np), sys.executable, str(EXAMPLES / script), *args],
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                              timeout=timeout, merge_stderr=True)
    return code, out


def _stdout(out, rank=0):
    """Lines the launcher tagged as `rank`'s stdout, without the tag."""
    tag = f"[{rank}]<stdout>:"
    return [line[len(tag):] for line in out.splitlines() if line.startswith(tag)]


def _digits(script, checkpoint, *args):
    code, out = _run_example(script, "--checkpoint", str(checkpoint), *args)
    assert code == 0, out
    lines = _stdout(out)
    match = IDENTICAL.search("\n".join(lines))
    assert match, out
    return lines, match.group(1), out


def _epochs(lines):
    """{epoch: accuracy %} from rank 0's 'epoch  e/N  loss ...  val accuracy  a%' lines."""
    found = {}
    for line in lines:
        m = re.match(r"epoch\s+(\d+)/\d+\s+loss [\d.]+\s+val accuracy\s+([\d.]+)%", line)
        if m:
            found[int(m.group(1))] = float(m.group(2))
    return found


def test_digits_train_checkpoint_resume(tmp_path):
    ckpt = tmp_path / "digits.pt"
    lines, _, out = _digits("digits_train.py", ckpt, "--epochs", "2")
    epochs = _epochs(lines)
    assert sorted(epochs) == [1, 2], out
    assert all(0 <= a <= 100 for a in epochs.values()), out
    assert not any("resuming" in line for line in lines), out
    assert ckpt.exists()

    # Resumed: only epoch 3 runs, from rank 0's checkpoint of epoch 2.
    lines, resumed, out = _digits("digits_train.py", ckpt, "--epochs", "3", "--resume")
    assert f"resuming from epoch 2 (checkpoint {ckpt})" in lines, out
    assert sorted(_epochs(lines)) == [3], out
    # Chance is 10%: three epochs of training leave it well behind.
    assert _epochs(lines)[3] > 50, out

    # --no-resume ignores the (now 3-epoch) checkpoint and trains from scratch.
    # Weights, optimizer momentum and the warm-up's position all came back from
    # the checkpoint, so the resumed run ends bit for bit where this one does.
    lines, fresh, out = _digits("digits_train.py", ckpt, "--epochs", "3", "--no-resume")
    assert sorted(_epochs(lines)) == [1, 2, 3], out
    assert not any("resuming" in line for line in lines), out
    assert fresh == resumed


def test_digits_train_with_adasum(tmp_path):
    """Horovod's --use-adasum: DistributedOptimizer(op=Adasum), the rate unscaled."""
    lines, _, out = _digits("digits_train.py", tmp_path / "adasum.pt", "--epochs", "3",
                            "--use-adasum")
    assert any(line.rstrip().endswith("x 1 after 1 warm-up epoch(s), Adasum") for line in lines), \
        out
    epochs = _epochs(lines)
    assert sorted(epochs) == [1, 2, 3], out
    assert epochs[3] > 30 and epochs[3] > epochs[1], out  # chance is 10%


def test_digits_train_scripted(tmp_path):
    lines, _, out = _digits("digits_train_scripted.py", tmp_path / "scripted.pt",
                            "--epochs", "2")
    assert "RecursiveScriptModule" in lines[0], out
    assert sorted(_epochs(lines)) == [1, 2], out


def test_synthetic_benchmark(tmp_path):
    results = tmp_path / "synthetic.json"
    code, out = _run_example(
        "synthetic_benchmark.py", "--num-iters", "1", "--num-batches-per-iter", "1",
        "--num-warmup-batches", "1", "--batch-size", "8", "--json", str(results))
    assert code == 0, out
    text = "\n".join(_stdout(out))
    for section in ("local (no communication):", "sync (no gradients sent: the bound):",
                    "hvd-torch:", "DDP (gloo):"):
        assert section in text, out
    assert len(re.findall(r"Total img/sec on 2 rank\(s\): [\d.]+ \+-[\d.]+", text)) == 4, out
    assert len(re.findall(r"Scaling efficiency: [\d.]+%", text)) == 3, out
    assert len(re.findall(r"Of the sync bound: [\d.]+%", text)) == 2, out
    assert re.search(r"Ratio hvd/ddp \(total img/sec\): [\d.]+ .*per iteration: median [\d.]+, "
                     r"range [\d.]+-[\d.]+", text), out
    assert "Weights identical on all ranks: hvd True, ddp True" in text, out
    report = json.loads(results.read_text())
    assert report["np"] == 2
    assert set(report["results"]) == {"local", "sync", "hvd", "ddp"}
    assert report["ratio_hvd_ddp"] > 0
    assert len(report["ratio_hvd_ddp_per_iter"]) == 1
    for name in ("hvd", "ddp"):
        r = report["results"][name]
        assert r["of_sync_bound"] == pytest.approx(
            r["img_sec_total"] / report["results"]["sync"]["img_sec_total"])


def test_two_trials_in_process_sets():
    code, out = _run_example("digits_two_trials.py", "--epochs", "1", np=3)
    assert code == 0, out
    lines = _stdout(out)
    assert any(line.startswith("process set 1 (ranks [0, 2]): lr 0.1, test accuracy")
               and line.endswith("identical weights on its ranks") for line in lines), out
    assert any(line.startswith("process set 2 (ranks [1]): lr 0.01,") for line in lines), out


def test_elastic_digits_under_elastic_hvdrun(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    cmd = [sys.executable, "-m", "hvdrun", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(EXAMPLES / "discover_hosts.sh"),
           sys.executable, str(EXAMPLES / "digits_elastic.py"), "--epochs", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HVD_HOSTS_FILE=str(hosts))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, proc.stdout
    assert "epoch 1: 2 workers, test accuracy" in proc.stdout, proc.stdout
    assert "done (pid" in proc.stdout


def _scalars(logdir):
    """{tag: [(step, value)]} from the TensorBoard event files under logdir, read as
    TFRecords (length, crc, Event proto, crc) with tensorboardX's Event proto."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    found = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_digits_train_writes_tensorboard_scalars(tmp_path):
    logdir = tmp_path / "tb"
    lines, _, out = _digits("digits_train.py", tmp_path / "tb.pt", "--epochs", "2",
                            "--logdir", str(logdir))
    scalars = _scalars(logdir)
    assert set(scalars) == {"train/loss", "val/accuracy", "train/samples_per_sec",
                            "train/comm_seconds", "train/lr"}, scalars
    for tag, points in scalars.items():
        assert [step for step, _ in points] == [1, 2], (tag, points)
    # The logged accuracy is the one rank 0 printed, per epoch.
    printed = _epochs(lines)
    for step, value in scalars["val/accuracy"]:
        assert abs(100 * value - printed[step]) < 0.06, (value, printed)
    assert scalars["train/loss"][1][1] < scalars["train/loss"][0][1]
    assert all(v > 0 for _, v in scalars["train/samples_per_sec"])
    assert all(0 < v < 60 for _, v in scalars["train/comm_seconds"])
    # Only rank 0 writes.
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 1


def test_progress_bars_are_optional(monkeypatch, capsys):
    """Without tqdm the examples' loops run plain (examples/progress.py)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` fails
    from progress import progress

    bar = progress(range(3), desc="x", unit="batch")
    assert [i * 2 for i in bar] == [0, 2, 4]
    bar.set_postfix(loss="0.1")
    bar.write("Iter #0: 12.5 img/sec")
    bar.close()
    assert capsys.readouterr().out == "Iter #0: 12.5 img/sec\n"
