"""The store's handshake (hvdrun/store_protocol.py) under attack: the secret never
crosses the wire, both clients refuse a server that cannot prove it knows the secret,
a recorded handshake replayed to the live server is refused, and a version mismatch
names both versions on both sides.

A squatter here is what took the store's port first (issue #44: Slurm's per-node port
is predictable): a plain listener that records every byte a client sends it and
answers as told.  Everything is on 127.0.0.1, each socket with a timeout.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import pytest
from store_wire import handshake, hello, read_reply
from test_store import cpp_store_client  # noqa: F401 (the fixture: build the C++ client once)

from hvdrun.store import KVStoreClient, KVStoreServer, StoreAuthError, StoreError
from hvdrun.store_protocol import (
    OP_PROOF, PROTOCOL_VERSION, ST_CHALLENGE, ST_ERROR, ST_OK, U32, Reader, frame, make_secret,
    pack_bytes, secret_to_hex,
)  # fmt: skip

HOST = "127.0.0.1"
UNPROVEN = "could not prove it knows the job's secret"


class Squatter(threading.Thread):
    """Listens on a port before the job's store would; for each connection, reads
    until the client hangs up (or 5 s), answering its first bytes with `answer`
    (None: hang up on them).  `received` holds every byte of every connection."""

    def __init__(self, answer: bytes | None):
        super().__init__(daemon=True)
        self.answer = answer
        self.listener = socket.create_server((HOST, 0))
        self.listener.settimeout(0.1)  # stop() is seen within this
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self.stopping = False
        self.start()

    def run(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                answered = False
                try:
                    while True:
                        data = conn.recv(65536)
                        if not data:
                            break
                        self.received += data
                        if not answered:
                            if self.answer is None:
                                break
                            conn.sendall(self.answer)
                            answered = True
                except OSError:
                    pass

    def stop(self) -> None:
        self.stopping = True
        self.join(timeout=10)
        self.listener.close()

    def assert_learned_nothing(self, secret: bytes) -> None:
        got = bytes(self.received)
        assert self.connections >= 1 and got, "the client never reached the squatter"
        for form in (secret, secret.hex().encode(), secret.hex().upper().encode()):
            assert form not in got, "the squatter received the secret"


def _challenge(version: int, nonce: bytes, proof: bytes) -> bytes:
    return frame(bytes([ST_CHALLENGE]) + U32.pack(version) + pack_bytes(nonce) + pack_bytes(proof))


# What a squatter may answer a HELLO: the OK the old protocol's client took as
# success, a challenge with a proof it cannot make, garbage, or nothing at all.
ANSWERS = {
    "ok": frame(bytes([ST_OK])),
    "forged_challenge": _challenge(PROTOCOL_VERSION, os.urandom(32), os.urandom(32)),
    "garbage": os.urandom(64),
    "hang_up": None,
}


@pytest.fixture(params=sorted(ANSWERS))
def squatter(request):
    s = Squatter(ANSWERS[request.param])
    yield request.param, s
    s.stop()


def test_python_client_refuses_a_squatter_that_learns_no_secret(squatter):
    kind, s = squatter
    secret = make_secret()
    with pytest.raises(StoreError) as info:
        KVStoreClient(HOST, s.port, secret, connect_timeout=5)
    if kind in ("ok", "forged_challenge"):
        assert isinstance(info.value, StoreAuthError)
        assert UNPROVEN in str(info.value) and f"{HOST}:{s.port}" in str(info.value)
    s.assert_learned_nothing(secret)


def test_cpp_client_refuses_a_squatter_that_learns_no_secret(
    cpp_store_client,  # noqa: F811 (the fixture imported above)
    squatter,
):
    kind, s = squatter
    secret = make_secret()
    run = subprocess.run(
        [cpp_store_client, HOST, str(s.port), secret_to_hex(secret), "--refused"],
        check=False, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "refused:" in run.stdout
    if kind in ("ok", "forged_challenge"):
        assert UNPROVEN in run.stdout and f"{HOST}:{s.port}" in run.stdout, run.stdout
    s.assert_learned_nothing(secret)


class Recorder(threading.Thread):
    """A proxy in front of the live store: forwards one connection both ways and keeps
    what the client sent, as an eavesdropper on the network would."""

    def __init__(self, target_port: int):
        super().__init__(daemon=True)
        self.target_port = target_port
        self.listener = socket.create_server((HOST, 0))
        self.listener.settimeout(10)
        self.port = self.listener.getsockname()[1]
        self.sent = bytearray()
        self.start()

    def run(self) -> None:
        conn, _ = self.listener.accept()
        upstream = socket.create_connection((HOST, self.target_port), timeout=10)
        back = threading.Thread(target=self._pump, args=(upstream, conn, None), daemon=True)
        back.start()
        self._pump(conn, upstream, self.sent)
        back.join(timeout=10)
        conn.close()
        upstream.close()
        self.listener.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, keep: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if keep is not None:
                    keep += data
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def test_a_recorded_handshake_replayed_to_the_live_server_is_refused():
    with KVStoreServer(HOST, 0, make_secret()) as server:
        recorder = Recorder(server.port)
        with KVStoreClient(HOST, recorder.port, server.secret, connect_timeout=5) as c:
            c.set("replayed/key", b"the job's")
        recorder.join(timeout=10)
        recorded = bytes(recorder.sent)
        assert server.secret not in recorded and server.secret.hex().encode() not in recorded
        assert server.snapshot() == {"replayed/key": b"the job's"}
        with KVStoreClient(HOST, server.port, server.secret, connect_timeout=5) as c:
            c.delete("replayed/key")

        # The whole recording at once: HELLO, PROOF and the SET behind them.
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            s.sendall(recorded)
            first, second = read_reply(s), read_reply(s)
            assert first[0] == ST_CHALLENGE  # a fresh server nonce: the old proof is void
            assert second[0] == ST_ERROR and b"bad proof" in second, second
            assert read_reply(s) is None  # closed: the SET is never read
        # The recorded PROOF after a HELLO of our own is refused as well.
        proof_frame = recorded[45:86]
        assert proof_frame[4] == OP_PROOF
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            s.sendall(hello())
            assert read_reply(s)[0] == ST_CHALLENGE
            s.sendall(proof_frame)
            assert b"bad proof" in read_reply(s)
        assert server.snapshot() == {}
        # And the server serves on.
        with KVStoreClient(HOST, server.port, server.secret, connect_timeout=5) as c:
            assert c.add("after", 1) == 1


def test_a_client_without_the_secret_is_refused_by_the_server():
    """The server's side: a client that skips checking the server's proof and sends
    a proof made with another secret is refused, and gets nothing."""
    with KVStoreServer(HOST, 0, make_secret()) as server:
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            with pytest.raises(AssertionError):
                handshake(s, make_secret())  # the server's proof does not check out
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            s.sendall(hello())
            assert read_reply(s)[0] == ST_CHALLENGE
            s.sendall(frame(bytes([OP_PROOF]) + pack_bytes(os.urandom(32))))
            reply = read_reply(s)
            assert reply[0] == ST_ERROR and b"does not know the job's secret" in reply
            assert read_reply(s) is None
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            handshake(s, server.secret)  # the real secret still gets in


def test_a_version_mismatch_names_both_versions_on_both_sides():
    with KVStoreServer(HOST, 0, make_secret()) as server:
        # A newer client's HELLO.
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            s.sendall(hello(version=PROTOCOL_VERSION + 1))
            reply = read_reply(s)
        assert reply[0] == ST_ERROR
        text = Reader(reply[1:]).str_()
        assert f"version {PROTOCOL_VERSION + 1}" in text and f"version {PROTOCOL_VERSION}" in text
        # A version-1 client, which sends its secret in AUTH (opcode 1).
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            s.sendall(frame(bytes([1]) + pack_bytes(server.secret)))
            text = Reader(read_reply(s)[1:]).str_()
        assert "version 1" in text and f"version {PROTOCOL_VERSION}" in text, text
    # The client's side: a store that answers with another version's CHALLENGE.
    other = Squatter(_challenge(PROTOCOL_VERSION + 1, os.urandom(32), os.urandom(32)))
    try:
        with pytest.raises(StoreAuthError) as info:
            KVStoreClient(HOST, other.port, make_secret(), connect_timeout=5)
    finally:
        other.stop()
    text = str(info.value)
    assert f"version {PROTOCOL_VERSION + 1}" in text and f"version {PROTOCOL_VERSION}" in text
    # A version-1 store's words to a HELLO, as the client reports them.
    old = Squatter(frame(bytes([ST_ERROR]) + pack_bytes(b"request (opcode 9) before AUTH")))
    try:
        with pytest.raises(StoreAuthError, match="this client speaks version 2, the store "
                                                 "speaks version 1"):
            KVStoreClient(HOST, old.port, make_secret(), connect_timeout=5)
    finally:
        old.stop()


def test_cpp_client_names_both_versions(cpp_store_client):  # noqa: F811
    other = Squatter(_challenge(PROTOCOL_VERSION + 1, os.urandom(32), os.urandom(32)))
    try:
        run = subprocess.run(
            [cpp_store_client, HOST, str(other.port), secret_to_hex(make_secret()), "--refused"],
            check=False, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    finally:
        other.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"version {PROTOCOL_VERSION + 1}" in run.stdout, run.stdout
    assert f"speaks version {PROTOCOL_VERSION}," in run.stdout, run.stdout


def test_hello_fields_are_what_the_cost_says():
    """HELLO, CHALLENGE, PROOF and OK: 45 + 81 + 41 + 5 = 172 bytes
    (store_protocol.py's cost line)."""
    with KVStoreServer(HOST, 0, make_secret()) as server:
        with socket.create_connection((HOST, server.port), timeout=5) as s:
            sent = handshake(s, server.secret)
    assert [len(f) for f in sent] == [45, 41]
    assert len(_challenge(PROTOCOL_VERSION, b"n" * 32, b"p" * 32)) == 81
    assert len(frame(bytes([ST_OK]))) == 5
