"""The rendezvous store: Python server and client, and the C++ client against them."""

import dataclasses
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from store_wire import handshake

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hvdrun.store import (
    KVStoreClient,
    KVStoreServer,
    StoreAuthError,
    StoreError,
    StoreTimeout,
    make_secret,
    secret_from_hex,
    secret_to_hex,
)


@pytest.fixture
def server():
    with KVStoreServer("127.0.0.1", 0, make_secret()) as srv:
        yield srv


@pytest.fixture
def client(server):
    with KVStoreClient(server.host, server.port, server.secret, connect_timeout=5) as c:
        yield c


def _connect(server):
    return KVStoreClient(server.host, server.port, server.secret, connect_timeout=5)


def _frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def _read_reply(sock) -> bytes:
    header = sock.recv(4, socket.MSG_WAITALL)
    (n,) = struct.unpack("<I", header)
    return sock.recv(n, socket.MSG_WAITALL)


def _closed(sock) -> bool:
    sock.settimeout(5)
    return sock.recv(1) == b""


# ---------------------------------------------------------------- basics


def test_set_get_roundtrip(client):
    client.set("a", b"\x00binary\xff")
    client.set("s", "text")
    assert client.get("a", timeout=1) == b"\x00binary\xff"
    assert client.get("s", timeout=1) == b"text"
    client.set("a", b"")
    assert client.get("a", timeout=1) == b""


def test_get_timeout_names_key_and_address(client, server):
    start = time.monotonic()
    with pytest.raises(StoreTimeout) as info:
        client.get("never/set", timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5
    assert info.value.keys == ["never/set"]
    assert "never/set" in str(info.value) and server.address in str(info.value)
    client.set("still", b"usable")  # a timeout is an answer, not a broken connection
    assert client.check("still")


def test_wait_returns_missing_keys(client):
    client.set("w/1", b"x")
    assert client.wait(["w/1", "w/2", "w/3"], timeout=0.1) == ["w/2", "w/3"]
    client.set("w/2", b"x")
    client.set("w/3", b"x")
    assert client.wait(["w/1", "w/2", "w/3"], timeout=0.1) == []
    assert client.wait([], timeout=0) == []


def test_add_counts_from_zero_as_int64(client):
    assert client.add("n", 5) == 5
    assert client.add("n", -7) == -2
    assert client.get("n", timeout=1) == struct.pack("<q", -2)
    client.set("m", struct.pack("<q", 40))
    assert client.add("m", 2) == 42


def test_add_on_non_integer_is_an_error_not_a_disconnect(client):
    client.set("text", b"hello")
    with pytest.raises(StoreError, match="text"):
        client.add("text", 1)
    assert client.get("text", timeout=1) == b"hello"


def test_check_list_delete(client):
    for key in ("rank/1", "rank/0", "other"):
        client.set(key, b"")
    assert client.check(["rank/0", "rank/1"])
    assert not client.check(["rank/0", "rank/2"])
    assert client.list_keys("rank/") == ["rank/0", "rank/1"]
    assert client.list_keys("nothing/") == []
    client.delete("rank/0")
    client.delete("rank/0")  # deleting a missing key is fine
    assert client.list_keys("rank/") == ["rank/1"]
    assert not client.check("rank/0")


@pytest.mark.unit
def test_secret_hex_roundtrip():
    secret = make_secret()
    assert len(secret) == 32 and make_secret() != secret
    assert secret_from_hex(secret_to_hex(secret)) == secret
    with pytest.raises(ValueError, match="hex"):
        secret_from_hex("not hex")


# ---------------------------------------------------------------- refusals


def test_wrong_secret_refused_and_server_keeps_serving(server):
    # The client checks the server first: with another secret, the server's proof
    # does not verify and the client goes no further.
    with pytest.raises(StoreAuthError, match="could not prove it knows the job's secret") as info:
        KVStoreClient(server.host, server.port, b"wrong", connect_timeout=5)
    assert server.address in str(info.value)
    with _connect(server) as good:
        good.set("after", b"ok")
        assert good.get("after", timeout=1) == b"ok"


def test_request_before_the_handshake_is_refused_and_closed(server):
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        key = b"k"
        sock.sendall(_frame(bytes([2]) + struct.pack("<I", 1) + key + struct.pack("<I", 0)))
        reply = _read_reply(sock)
        assert reply[0] == 3 and b"where the handshake's HELLO belongs" in reply
        assert _closed(sock)
    assert server.snapshot() == {}


def test_malformed_frame_is_refused_and_closed(server):
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        handshake(sock, server.secret)
        sock.sendall(_frame(bytes([2]) + struct.pack("<I", 100) + b"short"))  # truncated key
        reply = _read_reply(sock)
        assert reply[0] == 3 and b"malformed" in reply
        assert _closed(sock)
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(struct.pack("<I", 0xFFFFFFFF))  # absurd frame length
        assert _read_reply(sock)[0] == 3
        assert _closed(sock)
    with _connect(server) as good:
        assert good.add("alive", 1) == 1


# ---------------------------------------------------------------- concurrency


def test_concurrent_waiters_woken_by_set(server):
    results, errors = [], []

    def waiter():
        try:
            with _connect(server) as c:
                results.append(c.get("go", timeout=10))
        except Exception as e:  # noqa: BLE001 (surfaced by the asserts below)
            errors.append(e)

    threads = [threading.Thread(target=waiter) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    start = time.monotonic()
    with _connect(server) as setter:
        setter.set("go", b"now")
    for t in threads:
        t.join(timeout=5)
    assert time.monotonic() - start < 3
    assert errors == [] and results == [b"now"] * 6


def test_shared_client_across_threads(client):
    def work(i):
        for j in range(100):
            client.add("shared", 1)
            client.set(f"t/{i}", str(j))
            assert client.get(f"t/{i}", timeout=1) == str(j).encode()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert client.add("shared", 0) == 400


@pytest.mark.unit
def test_stop_unblocks_waiters_promptly():
    server = KVStoreServer().start()
    errors = []

    def waiter(timeout):
        try:
            with _connect(server) as c:
                c.get("never", timeout=timeout)
        except Exception as e:  # noqa: BLE001 (the test asserts on the type)
            errors.append(e)

    threads = [threading.Thread(target=waiter, args=(t,)) for t in (None, 60)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(server._conns) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    start = time.monotonic()
    server.stop()
    for t in threads:
        t.join(timeout=5)
    assert time.monotonic() - start < 2
    assert len(errors) == 2 and all(type(e) is StoreError for e in errors), errors
    with pytest.raises(StoreError):
        KVStoreClient(server.host, server.port, server.secret, connect_timeout=0.2)


@pytest.mark.unit
def test_client_retries_until_server_starts():
    with socket.socket() as probe:  # a free port; tiny race with other processes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = make_secret()
    server = KVStoreServer("127.0.0.1", port, secret)
    timer = threading.Timer(0.3, server.start)
    timer.start()
    try:
        with KVStoreClient("127.0.0.1", port, secret, connect_timeout=10) as c:
            c.set("late", b"ok")
            assert c.get("late", timeout=1) == b"ok"
    finally:
        timer.join()
        server.stop()


@pytest.mark.unit
def test_connect_timeout_names_address():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}.*0.3s"):
        KVStoreClient("127.0.0.1", port, b"s", connect_timeout=0.3)
    assert 0.25 < time.monotonic() - start < 3


# ---------------------------------------------------------------- C++ client


@pytest.fixture(scope="module")
def cpp_store_client(tmp_path_factory):
    """The compiled tests/cpp/test_store_client, or a skip without g++.
    `make -C tests/cpp` passes a prebuilt one in HVD_STORE_CLIENT_TEST."""
    prebuilt = os.environ.get("HVD_STORE_CLIENT_TEST")
    if prebuilt:
        return str(ROOT / prebuilt)
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    exe = tmp_path_factory.mktemp("cpp") / "test_store_client"
    cmd = [
        gxx, "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
        str(ROOT / "csrc/core/store_client.cc"), str(ROOT / "csrc/core/hmac_sha256.cc"),
        str(ROOT / "tests/cpp/test_store_client.cc"),
        "-o", str(exe),
    ]  # fmt: skip
    build = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return str(exe)


def test_cpp_store_client(cpp_store_client, server, client):
    client.set("py/hello", b"from python")
    run = subprocess.run(
        [cpp_store_client, server.host, str(server.port), secret_to_hex(server.secret)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().endswith("11 passed, 0 failed"), run.stdout
    # And the other direction: what C++ wrote, Python reads.
    assert client.get("cpp/t0", timeout=1) == b"199"
    assert client.add("cpp/shared", 0) == 1600


def test_cpp_store_client_sees_closed_store(cpp_store_client):
    server = KVStoreServer().start()
    proc = subprocess.Popen(
        [cpp_store_client, server.host, str(server.port), secret_to_hex(server.secret), "--closed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with _connect(server) as c:
            assert c.wait(["cpp/closed/waiting"], timeout=10) == []
        time.sleep(0.1)  # let it block in get()
        server.stop()
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, out
    assert "closed_store ok" in out and server.address in out


def test_cpp_store_client_names_the_frame_limit_when_refused(cpp_store_client):
    """A value over the store's frame limit: the server refuses it before
    reading it all and closes; the C++ client reports the server's reason (the
    limit and HVD_TORCH_STORE_MAX_FRAME), not a lost connection."""
    from hvdrun.store_server import StoreLimits

    limits = dataclasses.replace(StoreLimits(), max_frame=1 << 16)
    with KVStoreServer("127.0.0.1", 0, make_secret(), limits=limits) as server:
        run = subprocess.run(
            [cpp_store_client, server.host, str(server.port), secret_to_hex(server.secret),
             "--oversized"], check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "larger than the store's limit of 65536 bytes" in run.stdout, run.stdout
