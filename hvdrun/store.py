"""Key-value store for rendezvous: its Python client, and the names of the whole store.

The launcher (or the Ray driver, or the test harness) serves one store per job
(KVStoreServer, store_server.py); every rank's engine connects to it with the C++
client in csrc/core/store_client.h to exchange addresses and wait for peers.  The
wire format is in store_protocol.py.  Standard library only, so the launcher starts
without importing torch.
"""

from __future__ import annotations

import hmac
import os
import socket
import threading
import time

from .store_protocol import (
    I64, NONCE_BYTES, OP_ADD, OP_CHECK, OP_DELETE, OP_GET, OP_HELLO, OP_LIST, OP_PROOF, OP_SET,
    OP_WAIT, PROTOCOL_VERSION, ST_CHALLENGE, ST_ERROR, ST_INT, ST_KEYS, ST_OK, ST_TIMEOUT, ST_VALUE,
    U32, WAIT_FOREVER_MS, Malformed, Reader, StoreAuthError, StoreError, StoreTimeout, client_proof,
    frame, make_secret, pack_bytes, pack_str, pack_strs, recv_exact, secret_from_hex,
    secret_to_hex, server_proof,
)  # fmt: skip
from .store_server import KVStoreServer, StoreLimits

__all__ = [
    "DEFAULT_TIMEOUT",
    "KVStoreClient",
    "KVStoreServer",
    "StoreAuthError",
    "StoreError",
    "StoreLimits",
    "StoreTimeout",
    "make_secret",
    "secret_from_hex",
    "secret_to_hex",
]

# Client-side default for get/wait so that a forgotten timeout never hangs a job.
DEFAULT_TIMEOUT = 300.0
# Extra time the client allows the server to answer a timed request before it
# gives up on the connection itself.
_REPLY_SLACK = 30.0


class KVStoreClient:
    """Blocking client.  Thread-safe: requests are serialized by a lock, so a long
    get()/wait() holds up other threads using the same client."""

    def __init__(self, host: str, port: int, secret: bytes, connect_timeout: float = 30.0):
        self.address = f"{host}:{port}"
        self._lock = threading.Lock()
        self._sock = _connect(host, port, connect_timeout, self.address)
        try:
            self._handshake(bytes(secret))
        except BaseException:
            self.close()
            raise

    def _handshake(self, secret: bytes) -> None:
        """HELLO, the server's proof checked, then ours (store_protocol.py): the secret
        never leaves this process, and a server that cannot prove it hears nothing."""
        nonce = os.urandom(NONCE_BYTES)
        hello = bytes([OP_HELLO]) + U32.pack(PROTOCOL_VERSION) + pack_bytes(nonce)
        status, body = self._call(hello, _REPLY_SLACK, raw=True)
        if status == ST_ERROR:
            why = body.str_()
            if "before AUTH" in why:  # what a version-1 store says to a HELLO
                why = (
                    f"store protocol version mismatch: this client speaks version "
                    f"{PROTOCOL_VERSION}, the store speaks version 1 ({why})"
                )
            raise StoreAuthError(f"the store at {self.address} refused this client: {why}")
        unproven = StoreAuthError(
            f"the store at {self.address} could not prove it knows the job's secret "
            "(is something else listening on the port?)"
        )
        if status != ST_CHALLENGE:
            raise unproven
        try:
            version = body.u32()
            if version != PROTOCOL_VERSION:
                raise StoreAuthError(
                    f"store protocol version mismatch: this client speaks version "
                    f"{PROTOCOL_VERSION}, the store at {self.address} speaks version {version}"
                )
            server_nonce, proof = body.bytes_(), body.bytes_()
            body.end()
        except Malformed:
            raise unproven from None
        want = server_proof(secret, PROTOCOL_VERSION, nonce, server_nonce)
        if len(server_nonce) != NONCE_BYTES or not hmac.compare_digest(proof, want):
            raise unproven
        mine = client_proof(secret, PROTOCOL_VERSION, nonce, server_nonce)
        status, body = self._call(bytes([OP_PROOF]) + pack_bytes(mine), _REPLY_SLACK, raw=True)
        if status == ST_ERROR:
            raise StoreAuthError(
                f"the store at {self.address} refused this client: {body.str_()}"
            )
        self._expect((status, body), ST_OK, "PROOF")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set(self, key: str, value: bytes | str) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8")
        reply = self._call(bytes([OP_SET]) + pack_str(key) + pack_bytes(bytes(value)), _REPLY_SLACK)
        self._expect(reply, ST_OK, "SET")

    def get(self, key: str, timeout: float | None = DEFAULT_TIMEOUT) -> bytes:
        """The value of key once it exists; StoreTimeout after timeout seconds.
        timeout=None waits forever."""
        timeout_ms, reply_timeout = _timeouts(timeout)
        reply = self._call(bytes([OP_GET]) + pack_str(key) + U32.pack(timeout_ms), reply_timeout)
        status, body = reply
        if status == ST_TIMEOUT:
            raise StoreTimeout(_read_strs(body), self.address, timeout)
        self._expect(reply, ST_VALUE, "GET")
        return body.bytes_()

    def wait(self, keys, timeout: float | None = DEFAULT_TIMEOUT) -> list[str]:
        """Waits until all keys exist; returns the keys still missing ([] = all)."""
        keys = _as_list(keys)
        timeout_ms, reply_timeout = _timeouts(timeout)
        request = bytes([OP_WAIT]) + pack_strs(keys) + U32.pack(timeout_ms)
        reply = self._call(request, reply_timeout)
        status, body = reply
        if status == ST_TIMEOUT:
            return _read_strs(body)
        self._expect(reply, ST_OK, "WAIT")
        return []

    def add(self, key: str, delta: int = 1) -> int:
        reply = self._call(bytes([OP_ADD]) + pack_str(key) + I64.pack(delta), _REPLY_SLACK)
        self._expect(reply, ST_INT, "ADD")
        return reply[1].i64()

    def delete(self, key: str) -> None:
        self._expect(self._call(bytes([OP_DELETE]) + pack_str(key), _REPLY_SLACK), ST_OK, "DELETE")

    def check(self, keys) -> bool:
        reply = self._call(bytes([OP_CHECK]) + pack_strs(_as_list(keys)), _REPLY_SLACK)
        self._expect(reply, ST_INT, "CHECK")
        return reply[1].i64() == 1

    def list_keys(self, prefix: str = "") -> list[str]:
        reply = self._call(bytes([OP_LIST]) + pack_str(prefix), _REPLY_SLACK)
        self._expect(reply, ST_KEYS, "LIST")
        return _read_strs(reply[1])

    # -- plumbing

    def _call(
        self, request: bytes, reply_timeout: float | None, raw: bool = False
    ) -> tuple[int, Reader]:
        """Sends one request and reads its reply; ERROR raises unless raw."""
        with self._lock:
            if self._sock is None:
                raise StoreError(f"client for the store at {self.address} is closed")
            try:
                self._sock.settimeout(reply_timeout)
                try:
                    self._sock.sendall(frame(request))
                except OSError:
                    # The server refuses a frame over its limit (and says why) before
                    # reading it all, then closes: its ERROR explains the broken pipe.
                    payload = _refusal(self._sock)
                    if payload is None:
                        raise
                else:
                    payload = _read_frame(self._sock)
            except socket.timeout:
                raise StoreError(f"the store at {self.address} did not answer in time") from None
            except OSError as e:
                raise StoreError(f"lost the connection to the store at {self.address}: {e}") from e
            if payload is None:
                raise StoreError(f"the store at {self.address} closed the connection")
        body = Reader(payload)
        status = body.u8()
        if status == ST_ERROR and not raw:
            raise StoreError(f"the store at {self.address} answered: {body.str_()}")
        return status, body

    def _expect(self, reply: tuple[int, Reader], status: int, op: str) -> None:
        if reply[0] != status:
            raise StoreError(
                f"unexpected reply status {reply[0]} to {op} from the store at {self.address}"
            )


def _connect(host: str, port: int, timeout: float, address: str) -> socket.socket:
    """Connects, retrying: ranks may start before the server listens."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        remaining = deadline - time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=max(remaining, 0.1))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreError(
                    f"cannot connect to the store at {address} within {timeout:g}s: {e}"
                ) from e
        # The last sleep is cut short so that one attempt lands at the deadline.
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.5)


def _read_frame(sock: socket.socket) -> bytes | None:
    header = recv_exact(sock, 4)
    return None if header is None else recv_exact(sock, U32.unpack(header)[0])


def _refusal(sock: socket.socket) -> bytes | None:
    """An ERROR reply the server sent before closing, if one is there to read."""
    try:
        sock.settimeout(1.0)
        payload = _read_frame(sock)
    except OSError:
        return None
    return payload if payload and payload[0] == ST_ERROR else None


def _timeouts(timeout: float | None) -> tuple[int, float | None]:
    """(timeout_ms for the wire, socket timeout for the reply)."""
    if timeout is None:
        return WAIT_FOREVER_MS, None
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
    ms = min(int(timeout * 1000), WAIT_FOREVER_MS - 1)
    return ms, timeout + _REPLY_SLACK


def _as_list(keys) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def _read_strs(body: Reader) -> list[str]:
    return body.strs(body.u32())
