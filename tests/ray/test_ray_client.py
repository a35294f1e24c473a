"""A driver connected through Ray Client (ray.init("ray://...")) is refused with
a clear message by RayExecutor.start(), static and elastic: the job's
rendezvous store lives in the driver process, which the cluster's workers could
not reach, so the alternative is a rendezvous that times out.

A real Ray Client server (Ray's own, `python -m ray.util.client.server`) serves
the shared local Ray of this shape, in its own process session on a port of its
own; the driver is a fresh process that connects through ray://. The server
runs in "legacy" mode: it is itself the client's driver on the cluster, where a
`ray start --head` would first start a whole head of its own (GCS, raylet,
agents) and a proxy, then one more server process per client. The server's
whole session is killed afterwards."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_harness import no_leaks, ray_address, ray_module_fixture  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]

# Any shape serves; this one's Ray runs anyway (test_ray_executor and others).
RAY_SHAPE = dict(num_cpus=4, num_gpus=4)
ray_session = ray_module_fixture(**RAY_SHAPE)
pytestmark = [pytest.mark.usefixtures("ray_session", "no_leaks"), pytest.mark.timeout(180)]

DRIVER = """
import sys, time
import ray
from ray_integration import RayExecutor
deadline = time.monotonic() + 90
while True:
    try:
        ray.init("ray://127.0.0.1:%(port)d")
        break
    except Exception as e:  # the client server is still starting
        if time.monotonic() > deadline:
            raise SystemExit("could not connect: %%r" %% e)
        time.sleep(0.2)
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


def _session_processes(sid):
    out = subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def test_ray_client_driver_is_refused_clearly():
    pytest.importorskip("grpc", reason="Ray Client needs ray[client] (scripts/setup.sh)")
    client_port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "ray.util.client.server", "--mode=legacy", "--host=127.0.0.1",
         f"--port={client_port}", f"--address={ray_address()}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run = subprocess.run([sys.executable, "-c", DRIVER % {"port": client_port}],
                             capture_output=True, text=True, timeout=120, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        deadline = time.monotonic() + 20
        while _session_processes(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _session_processes(server.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    results = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT")]
    assert len(results) == 2, run.stdout + run.stderr
    for line, what in zip(results, ("RayExecutor.start()", "ElasticRayExecutor.start()")):
        assert line.startswith("RESULT RuntimeError"), line
        assert what in line and "Ray Client (ray://) connections are not supported" in line, line
    assert not left, f"processes of the test's Ray Client server outlived it: {left}"
