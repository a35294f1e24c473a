"""Key-value store for rendezvous: a threaded TCP server and its Python client.

The launcher (or the Ray driver, or the test harness) serves one store per job;
every rank's engine connects to it with the C++ client in csrc/core/store_client.h
to exchange addresses and wait for peers.  Standard library only, so the launcher
starts without importing torch.

Wire protocol (binary, little-endian); the C++ client depends on every byte:
  Every message in both directions is a frame: u32 payload length, then payload.
  Request payload: u8 opcode, then arguments.  bytes/str are u32 length + raw
  bytes; integers are fixed-width.
    1 AUTH(secret)                  -> OK, or ERROR and the server closes
    2 SET(key, value)               -> OK (wakes waiters)
    3 GET(key, timeout_ms u32)      -> VALUE(value) or TIMEOUT([key])
    4 WAIT(n u32, keys.., timeout_ms u32) -> OK or TIMEOUT(missing keys)
    5 ADD(key, delta i64)           -> INT(new value); stored as 8-byte LE i64
    6 DELETE(key)                   -> OK
    7 CHECK(n u32, keys..)          -> INT(1) if all exist else INT(0)
    8 LIST(prefix)                  -> KEYS(existing keys starting with prefix)
  Reply payload: u8 status then body: 0 OK; 1 VALUE(bytes); 2 TIMEOUT(u32 n, n
  strs); 3 ERROR(str); 4 INT(i64); 5 KEYS(u32 n, n strs).
  AUTH must come first; a request before it, or a malformed frame, gets ERROR
  and the connection is closed.  timeout_ms 0xFFFFFFFF means wait forever.
"""

from __future__ import annotations

import hmac
import os
import select
import socket
import struct
import threading
import time

__all__ = [
    "DEFAULT_TIMEOUT",
    "KVStoreClient",
    "KVStoreServer",
    "StoreAuthError",
    "StoreError",
    "StoreTimeout",
    "make_secret",
    "secret_from_hex",
    "secret_to_hex",
]

OP_AUTH, OP_SET, OP_GET, OP_WAIT, OP_ADD, OP_DELETE, OP_CHECK, OP_LIST = range(1, 9)
ST_OK, ST_VALUE, ST_TIMEOUT, ST_ERROR, ST_INT, ST_KEYS = range(6)
WAIT_FOREVER_MS = 0xFFFFFFFF
# A frame larger than this is treated as garbage rather than allocated: values are
# addresses and small blobs, and a stray client (e.g. an HTTP probe) must not make
# the server allocate gigabytes.
MAX_FRAME = 1 << 30
# Client-side default for get/wait so that a forgotten timeout never hangs a job.
DEFAULT_TIMEOUT = 300.0
# Extra time the client allows the server to answer a timed request before it
# gives up on the connection itself.
_REPLY_SLACK = 30.0

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")


class StoreError(RuntimeError):
    """The store could not be reached, refused a request, or went away."""


class StoreAuthError(StoreError):
    """The server refused our secret."""


class StoreTimeout(StoreError):
    """Keys did not appear in time.  ``keys`` lists the ones still missing."""

    def __init__(self, keys, address, timeout):
        self.keys = list(keys)
        self.address = address
        self.timeout = timeout
        super().__init__(
            f"timed out after {timeout:g}s waiting for keys {self.keys} in the store at {address}"
        )


def make_secret() -> bytes:
    """A fresh per-job secret: 32 random bytes."""
    return os.urandom(32)


def secret_to_hex(secret: bytes) -> str:
    return secret.hex()


def secret_from_hex(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError("store secret is not a hex string (HOROVOD_SECRET_KEY?)") from None


# ---------------------------------------------------------------- encoding


class _Malformed(StoreError):
    """A frame that does not parse; on the client side this surfaces as StoreError."""


def _pack_bytes(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _pack_str(text: str) -> bytes:
    return _pack_bytes(text.encode("utf-8"))


def _pack_strs(items) -> bytes:
    return _U32.pack(len(items)) + b"".join(_pack_str(s) for s in items)


class _Reader:
    """Cursor over one frame's payload; running past the end is _Malformed."""

    def __init__(self, payload: bytes):
        self._buf = memoryview(payload)
        self._pos = 0

    def take(self, n: int) -> bytes:
        if n > len(self._buf) - self._pos:
            raise _Malformed("truncated frame")
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def bytes_(self) -> bytes:
        return self.take(self.u32())

    def str_(self) -> str:
        try:
            return self.bytes_().decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed("key is not valid UTF-8") from None

    def strs(self, n: int) -> list[str]:
        # Each key needs at least its 4-byte length, so a huge n in a small frame is
        # rejected before we loop over it.
        if n * 4 > len(self._buf) - self._pos:
            raise _Malformed("key count larger than the frame")
        return [self.str_() for _ in range(n)]

    def end(self) -> None:
        if self._pos != len(self._buf):
            raise _Malformed("trailing bytes after the request")


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes, or None if the peer closed cleanly before the first byte."""
    chunks = []
    got = 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            if got == 0:
                return None
            raise ConnectionError("connection closed in the middle of a frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_U32.pack(len(payload)) + payload)


# ---------------------------------------------------------------- server


class KVStoreServer:
    """Threaded store server: one thread per connection, one Condition for waits.

    start()/stop() are meant for the owning thread; the store's contents are also
    readable in-process through ``snapshot()``.  stop() wakes every waiter (they
    get ERROR), shuts every connection down and returns once the threads are gone.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: bytes | None = None):
        self.secret = make_secret() if secret is None else bytes(secret)
        if not self.secret:
            raise ValueError("the store secret must not be empty")
        self._bind = (host, port)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._addr: tuple[str, int] | None = None

    # -- lifecycle

    def start(self) -> KVStoreServer:
        if self._listener is not None:
            raise RuntimeError("KVStoreServer already started")
        host, port = self._bind
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            sock.listen(socket.SOMAXCONN)
        except OSError as e:
            sock.close()
            raise StoreError(f"cannot serve the store on {host}:{port}: {e}") from e
        # A short accept timeout backs up shutdown(): on some kernels shutting down a
        # listening socket does not wake a thread blocked in accept().
        sock.settimeout(0.2)
        self._listener = sock
        self._addr = (host, sock.getsockname()[1])
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="hvd-store-accept", daemon=True
        )
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        if self._listener is None or self._stopping:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._accept_thread.join(timeout=5)
        self._listener.close()
        with self._conns_lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            # shutdown, not close: the handler thread may be inside recv() on this
            # fd, and closing it under the thread could let the number be reused.
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in conns:
            thread.join(timeout=5)

    def __enter__(self) -> KVStoreServer:
        if self._listener is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return self._require_addr()[0]

    @property
    def port(self) -> int:
        return self._require_addr()[1]

    @property
    def address(self) -> str:
        host, port = self._require_addr()
        return f"{host}:{port}"

    def snapshot(self) -> dict[str, bytes]:
        """A copy of the current contents, for diagnostics in the serving process."""
        with self._cond:
            return dict(self._data)

    def _require_addr(self) -> tuple[str, int]:
        if self._addr is None:
            raise RuntimeError("KVStoreServer is not started")
        return self._addr

    # -- connections

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping:
                    return
                time.sleep(0.05)  # e.g. EMFILE: back off instead of spinning
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(
                target=self._serve, args=(conn,), name="hvd-store-conn", daemon=True
            )
            with self._conns_lock:
                if self._stopping:
                    conn.close()
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            authed = False
            while not self._stopping:
                header = _recv_exact(conn, 4)
                if header is None:
                    return
                length = _U32.unpack(header)[0]
                if length == 0 or length > MAX_FRAME:
                    _send_frame(conn, _error(f"bad frame length {length}"))
                    return
                payload = _recv_exact(conn, length)
                if payload is None:
                    return
                try:
                    reply, keep_open = self._handle(conn, _Reader(payload), authed)
                except _Malformed as e:
                    reply, keep_open = _error(f"malformed request: {e}"), False
                _send_frame(conn, reply)
                if not keep_open:
                    return
                # Before AUTH, only a successful AUTH keeps the connection open.
                authed = True
        except OSError:
            return  # peer reset, or stop() shut the socket down
        finally:
            with self._conns_lock:
                self._conns.pop(conn, None)
            conn.close()

    def _handle(self, conn: socket.socket, req: _Reader, authed: bool) -> tuple[bytes, bool]:
        """Returns (reply payload, keep the connection open)."""
        op = req.u8()
        if op == OP_AUTH:
            secret = req.bytes_()
            req.end()
            if hmac.compare_digest(secret, self.secret):
                return bytes([ST_OK]), True
            return _error("bad secret: this client does not belong to the job"), False
        if not authed:
            return _error(f"request (opcode {op}) before AUTH"), False

        if op == OP_SET:
            key, value = req.str_(), req.bytes_()
            req.end()
            with self._cond:
                self._data[key] = value
                self._cond.notify_all()
            return bytes([ST_OK]), True
        if op == OP_GET:
            key, timeout_ms = req.str_(), req.u32()
            req.end()
            missing = self._wait_for(conn, [key], timeout_ms)
            if missing is None:
                return _error("store is shutting down"), False
            if missing:
                return bytes([ST_TIMEOUT]) + _pack_strs(missing), True
            with self._cond:
                value = self._data.get(key)
            if value is None:  # deleted between the wake-up and now
                return bytes([ST_TIMEOUT]) + _pack_strs([key]), True
            return bytes([ST_VALUE]) + _pack_bytes(value), True
        if op == OP_WAIT:
            keys = req.strs(req.u32())
            timeout_ms = req.u32()
            req.end()
            missing = self._wait_for(conn, keys, timeout_ms)
            if missing is None:
                return _error("store is shutting down"), False
            if missing:
                return bytes([ST_TIMEOUT]) + _pack_strs(missing), True
            return bytes([ST_OK]), True
        if op == OP_ADD:
            key, delta = req.str_(), req.i64()
            req.end()
            with self._cond:
                old = self._data.get(key, _I64.pack(0))
                if len(old) != 8:
                    return _error(f"ADD on key {key!r} whose value is not an 8-byte integer"), True
                new = _I64.unpack(old)[0] + delta
                if not -(1 << 63) <= new < (1 << 63):
                    return _error(f"ADD on key {key!r} overflows int64"), True
                self._data[key] = _I64.pack(new)
                self._cond.notify_all()
            return bytes([ST_INT]) + _I64.pack(new), True
        if op == OP_DELETE:
            key = req.str_()
            req.end()
            with self._cond:
                self._data.pop(key, None)
            return bytes([ST_OK]), True
        if op == OP_CHECK:
            keys = req.strs(req.u32())
            req.end()
            with self._cond:
                present = all(k in self._data for k in keys)
            return bytes([ST_INT]) + _I64.pack(int(present)), True
        if op == OP_LIST:
            prefix = req.str_()
            req.end()
            with self._cond:
                keys = sorted(k for k in self._data if k.startswith(prefix))
            return bytes([ST_KEYS]) + _pack_strs(keys), True
        raise _Malformed(f"unknown opcode {op}")

    def _wait_for(self, conn: socket.socket, keys: list[str], timeout_ms: int) -> list[str] | None:
        """Missing keys after waiting ([] = all present), or None if stopping."""
        deadline = None if timeout_ms == WAIT_FOREVER_MS else time.monotonic() + timeout_ms / 1000
        with self._cond:
            while True:
                if self._stopping:
                    return None
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return []
                wait = 1.0
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return missing
                    wait = min(wait, remaining)
                self._cond.wait(wait)
                # A rank that died while waiting forever would otherwise pin this
                # thread for the life of the job; its EOF is readable on the socket.
                if _peer_closed(conn):
                    return None


def _peer_closed(conn: socket.socket) -> bool:
    # poll, not select: select() cannot watch descriptors >= 1024.
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _error(message: str) -> bytes:
    return bytes([ST_ERROR]) + _pack_str(message)


# ---------------------------------------------------------------- client


class KVStoreClient:
    """Blocking client.  Thread-safe: requests are serialized by a lock, so a long
    get()/wait() holds up other threads using the same client."""

    def __init__(self, host: str, port: int, secret: bytes, connect_timeout: float = 30.0):
        self.address = f"{host}:{port}"
        self._lock = threading.Lock()
        self._sock = _connect(host, port, connect_timeout, self.address)
        try:
            status, body = self._call(
                bytes([OP_AUTH]) + _pack_bytes(bytes(secret)), _REPLY_SLACK, raw=True
            )
            if status == ST_ERROR:
                raise StoreAuthError(
                    f"the store at {self.address} refused this client: {body.str_()}"
                )
            self._expect((status, body), ST_OK, "AUTH")
        except BaseException:
            self.close()
            raise

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
        reply = self._call(
            bytes([OP_SET]) + _pack_str(key) + _pack_bytes(bytes(value)), _REPLY_SLACK
        )
        self._expect(reply, ST_OK, "SET")

    def get(self, key: str, timeout: float | None = DEFAULT_TIMEOUT) -> bytes:
        """The value of key once it exists; StoreTimeout after timeout seconds.
        timeout=None waits forever."""
        timeout_ms, reply_timeout = _timeouts(timeout)
        reply = self._call(bytes([OP_GET]) + _pack_str(key) + _U32.pack(timeout_ms), reply_timeout)
        status, body = reply
        if status == ST_TIMEOUT:
            raise StoreTimeout(_read_strs(body), self.address, timeout)
        self._expect(reply, ST_VALUE, "GET")
        return body.bytes_()

    def wait(self, keys, timeout: float | None = DEFAULT_TIMEOUT) -> list[str]:
        """Waits until all keys exist; returns the keys still missing ([] = all)."""
        keys = _as_list(keys)
        timeout_ms, reply_timeout = _timeouts(timeout)
        request = bytes([OP_WAIT]) + _pack_strs(keys) + _U32.pack(timeout_ms)
        reply = self._call(request, reply_timeout)
        status, body = reply
        if status == ST_TIMEOUT:
            return _read_strs(body)
        self._expect(reply, ST_OK, "WAIT")
        return []

    def add(self, key: str, delta: int = 1) -> int:
        reply = self._call(bytes([OP_ADD]) + _pack_str(key) + _I64.pack(delta), _REPLY_SLACK)
        self._expect(reply, ST_INT, "ADD")
        return reply[1].i64()

    def delete(self, key: str) -> None:
        self._expect(self._call(bytes([OP_DELETE]) + _pack_str(key), _REPLY_SLACK), ST_OK, "DELETE")

    def check(self, keys) -> bool:
        reply = self._call(bytes([OP_CHECK]) + _pack_strs(_as_list(keys)), _REPLY_SLACK)
        self._expect(reply, ST_INT, "CHECK")
        return reply[1].i64() == 1

    def list_keys(self, prefix: str = "") -> list[str]:
        reply = self._call(bytes([OP_LIST]) + _pack_str(prefix), _REPLY_SLACK)
        self._expect(reply, ST_KEYS, "LIST")
        return _read_strs(reply[1])

    # -- plumbing

    def _call(
        self, request: bytes, reply_timeout: float | None, raw: bool = False
    ) -> tuple[int, _Reader]:
        """Sends one request and reads its reply; ERROR raises unless raw."""
        with self._lock:
            if self._sock is None:
                raise StoreError(f"client for the store at {self.address} is closed")
            try:
                self._sock.settimeout(reply_timeout)
                _send_frame(self._sock, request)
                header = _recv_exact(self._sock, 4)
                payload = (
                    None if header is None else _recv_exact(self._sock, _U32.unpack(header)[0])
                )
            except socket.timeout:
                raise StoreError(f"the store at {self.address} did not answer in time") from None
            except OSError as e:
                raise StoreError(f"lost the connection to the store at {self.address}: {e}") from e
            if payload is None:
                raise StoreError(f"the store at {self.address} closed the connection")
        body = _Reader(payload)
        status = body.u8()
        if status == ST_ERROR and not raw:
            raise StoreError(f"the store at {self.address} answered: {body.str_()}")
        return status, body

    def _expect(self, reply: tuple[int, _Reader], status: int, op: str) -> None:
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


def _read_strs(body: _Reader) -> list[str]:
    return body.strs(body.u32())
