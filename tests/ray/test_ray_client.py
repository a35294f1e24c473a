"""A driver connected through Ray Client (ray.init("ray://...")) is refused with
a clear message by RayExecutor.start(), static and elastic: the job's
rendezvous store lives in the driver process, which the cluster's workers could
not reach, so the alternative is a rendezvous that times out.

A real Ray head with its client server runs in its own process session on
ports and a temp dir of its own; the driver is a fresh process that connects
through ray://. Everything the head started is killed afterwards."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import sys, time
import ray
from ray_integration import RayExecutor
deadline = time.monotonic() + 90
while True:
    try:
        ray.init("ray://127.0.0.1:%(port)d")
        break
    except Exception as e:  # the head's client server is still starting
        if time.monotonic() > deadline:
            raise SystemExit("could not connect: %%r" %% e)
        time.sleep(1)
settings = RayExecutor.create_settings(verbose=0)
for make in (lambda: RayExecutor(settings, num_workers=1),
             lambda: RayExecutor(settings, min_workers=1, max_workers=1)):  # elastic
    try:
        make().start()
        print("RESULT started")
    except Exception as e:
        print("RESULT", type(e).__name__, str(e).replace("\\n", " "))
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_mentioning(text):
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]


@pytest.mark.timeout(300)
def test_ray_client_driver_is_refused_clearly():
    pytest.importorskip("grpc", reason="Ray Client needs ray[client] (scripts/setup.sh)")
    gcs_port, client_port = _free_port(), _free_port()
    temp_dir = tempfile.mkdtemp(prefix="hvdrc", dir="/tmp")
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={gcs_port}",
         f"--ray-client-server-port={client_port}", "--num-cpus=1", f"--temp-dir={temp_dir}",
         "--include-dashboard=false", "--node-ip-address=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run = subprocess.run([sys.executable, "-c", DRIVER % {"port": client_port}],
                             capture_output=True, text=True, timeout=200, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        deadline = time.monotonic() + 20
        while _processes_mentioning(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _processes_mentioning(temp_dir)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    results = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(results) == 2, run.stdout + run.stderr
    for line, what in zip(results, ("RayExecutor.start()", "ElasticRayExecutor.start()")):
        assert line.startswith("RESULT RuntimeError"), line
        assert what in line and "Ray Client (ray://) connections are not supported" in line, line
    assert not left, f"processes of the test's Ray head outlived it: {left}"
