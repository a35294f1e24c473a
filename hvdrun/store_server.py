"""The rendezvous store's server: one thread and one selector serve every connection.

The launcher (or the Ray driver, or the test harness) serves one store per job; every
rank's engine connects to it with the C++ client (csrc/core/store_client.h) to exchange
addresses and wait for peers.  The wire format is in store_protocol.py.

Why one thread.  A thread per connection let anyone who could reach the port pin a
thread and, before its handshake, a whole frame of up to 1 GiB; a failed
thread start ended the accept loop.  Here no connection costs more than its socket
and its buffers, and nothing is started per connection.  A blocking GET or WAIT is a
parked waiter, not a blocked thread: it is answered when a SET or ADD makes its keys
exist, when its timeout passes, or with ERROR when the store stops; a waiter whose
client hangs up is dropped at once (its EOF is a read event like any other).

What an unauthenticated client may cost (StoreLimits; docs/multihost.md):
  - its first frames must be the handshake's HELLO and PROOF (store_protocol.py),
    each at most AUTH_FRAME_LIMIT (4 KiB) bytes, complete within auth_timeout of
    connecting; anything else is answered ERROR and closed, so at most 4 KiB is
    buffered per such connection;
  - at most max_pending of them are held at once: a new one closes the oldest that
    has not sent its HELLO (else the oldest), so idle or slow connections cannot lock
    out a rank whose handshake ends within milliseconds of its connect;
  - running out of descriptors (EMFILE) also closes the oldest unauthenticated one.
An authenticated client may send frames up to max_frame; at most max_clients are
authenticated at once (a job's ranks and launchers need a few per rank).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import heapq
import hmac
import itertools
import os
import selectors
import socket
import threading
import time
from collections.abc import Mapping

from . import config
from .args import UsageError, positive_float, positive_int
from .output import note
from .store_protocol import (
    AUTH_FRAME_LIMIT, I64, NONCE_BYTES, OP_ADD, OP_AUTH_V1, OP_CHECK, OP_DELETE, OP_GET, OP_HELLO,
    OP_LIST, OP_PROOF, OP_SET, OP_WAIT, PROTOCOL_VERSION, ST_CHALLENGE, ST_INT, ST_KEYS, ST_OK,
    ST_TIMEOUT, ST_VALUE, U32, WAIT_FOREVER_MS, Malformed, Reader, StoreError, client_proof,
    error_reply, frame, make_secret, pack_bytes, pack_strs, server_proof,
)  # fmt: skip

__all__ = [
    "AUTH_TIMEOUT_ENV",
    "MAX_CLIENTS_ENV",
    "MAX_FRAME_ENV",
    "MAX_PENDING_ENV",
    "KVStoreServer",
    "StoreLimits",
]

AUTH_TIMEOUT_ENV = config.STORE_AUTH_TIMEOUT
MAX_PENDING_ENV = config.STORE_MAX_PENDING
MAX_CLIENTS_ENV = config.STORE_MAX_CLIENTS
MAX_FRAME_ENV = config.STORE_MAX_FRAME

_RECV_CHUNK = 1 << 16
# Accepted per turn of the loop, so that a connect flood cannot keep the loop from
# reading the clients it already has.
_ACCEPTS_PER_TURN = 64
# How long the loop stops accepting when the process is out of descriptors and no
# unauthenticated connection can be closed to make room.
_ACCEPT_PAUSE = 0.1
# The longest one select() waits.  epoll takes a C int of milliseconds (24.8 days), and
# a GET or WAIT may ask for up to 0xFFFFFFFE ms (49.7 days): select() raised
# OverflowError, which ended the loop's thread and with it the store (found by
# tests/unit/test_store_fuzz.py).  The loop wakes once an hour and looks again.
_MAX_SELECT = 3600.0
_LISTENER, _WAKE = object(), object()


@dataclasses.dataclass(frozen=True)
class StoreLimits:
    """What one store serves at most.  for_job() applies the HVD_TORCH_STORE_* overrides.

    auth_timeout: seconds from accept() to the handshake's end.
    max_pending: unauthenticated connections held at once; a new one closes the oldest.
    max_clients: authenticated connections at once; beyond it a new connection is
        closed at once, with ERROR.
    max_frame: bytes in one request of an authenticated client.  The largest a job
        sends is Gloo's full-mesh address blob, about 150 bytes per rank.
    """

    auth_timeout: float = 5.0
    max_pending: int = 64
    max_clients: int = 4096
    max_frame: int = 16 << 20

    @classmethod
    def for_job(cls, ranks: int | None = None, environ: Mapping[str, str] | None = None):
        """The limits for a job of `ranks` ranks (None: not known, e.g. elastic without
        --max-np).  Each rank holds one connection (its engine), an elastic worker one
        more, each launcher process one; twice that, plus room for launchers and for
        connections being replaced (a re-init connects before its old close is seen).
        Raises StoreError for a malformed override.  environ: None for os.environ."""
        over = config.Store.from_environment(environ)
        clients = cls.max_clients if ranks is None else 4 * ranks + 64
        try:
            return cls(
                auth_timeout=over.limit("auth_timeout", positive_float, cls.auth_timeout),
                max_pending=over.limit("max_pending", positive_int, cls.max_pending),
                max_clients=over.limit("max_clients", positive_int, clients),
                max_frame=over.limit("max_frame", positive_int, cls.max_frame),
            )
        except UsageError as e:
            raise StoreError(str(e)) from None


class _Waiter:
    """A parked GET (get=True, one key) or WAIT: the keys still missing are watched."""

    __slots__ = ("deadline", "get", "keys", "missing")

    def __init__(self, keys: list[str], get: bool, missing: set[str], deadline: float | None):
        self.keys, self.get, self.missing, self.deadline = keys, get, missing, deadline


class _Conn:
    """One client connection: its buffers and state; touched by the server's thread only."""

    __slots__ = (
        "authed",
        "closed",
        "deadline",
        "fd",
        "inbuf",
        "nonces",
        "outbuf",
        "sock",
        "waiter",
        "writing",
    )

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.fd = sock.fileno()
        self.deadline = deadline  # for the end of the handshake
        self.authed = False
        self.nonces: tuple[bytes, bytes] | None = None  # (client's, ours) after HELLO
        self.closed = False
        self.writing = False  # registered for EVENT_WRITE
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.waiter: _Waiter | None = None


class KVStoreServer:
    """The store's TCP server.  start()/stop() are for the owning thread; everything
    else happens on the server's own thread.  snapshot() may be called from any thread.
    stop() answers every waiter with ERROR, closes every connection and the listener,
    and returns once the server's thread is gone.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: bytes | None = None,
        limits: StoreLimits | None = None,
    ):
        self.secret = make_secret() if secret is None else bytes(secret)
        if not self.secret:
            raise ValueError("the store secret must not be empty")
        self.limits = StoreLimits.for_job() if limits is None else limits
        self._bind = (host, port)
        self._data: dict[str, bytes] = {}
        self._data_lock = threading.Lock()  # writes here, snapshot() elsewhere
        self._conns: dict[int, _Conn] = {}  # every open connection, by descriptor
        self._pending: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self._authed = 0
        self._watch: dict[str, set[_Conn]] = {}  # key -> connections waiting for it
        self._timers: list[tuple[float, int, _Conn, _Waiter]] = []  # heap of waiter deadlines
        self._timed = 0  # parked waiters with a deadline
        self._seq = itertools.count()
        self._runnable: collections.deque[_Conn] = collections.deque()
        self._accept_paused_until: float | None = None
        self._stopping = False
        self._listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_pair: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None
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
        sock.setblocking(False)
        self._listener = sock
        self._addr = (host, sock.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._wake_pair = socket.socketpair()
        for end in self._wake_pair:
            end.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake_pair[0], selectors.EVENT_READ, _WAKE)
        thread = threading.Thread(target=self._run, name="hvd-store", daemon=True)
        try:
            thread.start()
        except RuntimeError as e:  # "can't start new thread"
            self._release()
            self._listener = None
            raise StoreError(f"cannot start the store's thread: {e}") from e
        self._thread = thread
        return self

    def stop(self) -> None:
        if self._thread is None or self._stopping:
            return
        self._stopping = True
        try:
            self._wake_pair[1].send(b"\0")
        except OSError:
            pass  # the loop is awake already (its wake-up buffer is full)
        self._thread.join(timeout=5)

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
        with self._data_lock:
            return dict(self._data)

    def _require_addr(self) -> tuple[str, int]:
        if self._addr is None:
            raise RuntimeError("KVStoreServer is not started")
        return self._addr

    # -- the loop

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._turn()
        finally:
            for conn in list(self._conns.values()):
                if conn.waiter is not None:
                    self._refuse(conn, "store is shutting down")
                else:
                    self._close(conn)
            self._release()

    def _release(self) -> None:
        """Closes the listener, the wake-up pair and the selector (on the loop's thread
        once it ran, so that no close races a select)."""
        self._selector.close()
        self._listener.close()
        for end in self._wake_pair:
            end.close()

    def _turn(self) -> None:
        """One select() and what it found: reads first, so that a handshake frame which has
        arrived is handled before new connections could push its connection out."""
        ready = self._selector.select(self._next_timeout())
        accept = False
        for key, mask in ready:
            if key.data is _LISTENER:
                accept = True
            elif key.data is _WAKE:
                try:
                    self._wake_pair[0].recv(64)
                except OSError:
                    pass
            else:
                self._guarded(key.data, self._on_event, mask)
        while self._runnable:
            conn = self._runnable.popleft()
            self._guarded(conn, self._process)
        now = time.monotonic()
        self._expire(now)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
            accept = True
        if accept and self._accept_paused_until is None:
            self._accept(now)

    def _guarded(self, conn: _Conn, step, *args) -> None:
        """step(conn, *args); a connection whose handling fails is closed, and the
        others are served on."""
        if conn.closed:
            return
        try:
            step(conn, *args)
        except Exception as e:  # noqa: BLE001  (one client must not end the store)
            note(f"store: closed a connection after an internal error: {e!r}")
            self._close(conn)

    def _next_timeout(self) -> float | None:
        if self._runnable:
            return 0.0
        deadlines = []
        if self._pending:
            deadlines.append(next(iter(self._pending.values())).deadline)
        if self._timers:
            deadlines.append(self._timers[0][0])
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        if not deadlines:
            return None
        return min(_MAX_SELECT, max(0.0, min(deadlines) - time.monotonic()))

    def _expire(self, now: float) -> None:
        while self._pending:
            conn = next(iter(self._pending.values()))
            if conn.deadline > now:
                break
            self._refuse(
                conn,
                f"no handshake within {self.limits.auth_timeout:g}s of connecting "
                f"({AUTH_TIMEOUT_ENV})",
            )
        while self._timers and self._timers[0][0] <= now:
            _, _, conn, waiter = heapq.heappop(self._timers)
            if conn.waiter is waiter:
                self._end_wait(conn)
                missing = [k for k in waiter.keys if k not in self._data]
                if missing:
                    self._reply(conn, bytes([ST_TIMEOUT]) + pack_strs(missing))
                else:
                    self._answer(conn, waiter)
                self._runnable.append(conn)

    # -- connections

    def _accept(self, now: float) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno == errno.ECONNABORTED:
                    continue
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) and (
                    self._pending
                ):
                    self._evict_oldest("the store's process is out of file descriptors")
                    continue
                # Out of descriptors with nothing to give back, or an error we do not
                # know: stop accepting for a moment rather than spin on it.
                self._selector.unregister(self._listener)
                self._accept_paused_until = now + _ACCEPT_PAUSE
                return
            self._admit(sock, now)

    def _admit(self, sock: socket.socket, now: float) -> None:
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()  # reset before we got to it
            return
        if self._authed >= self.limits.max_clients:
            _try_send(sock, error_reply(self._clients_full()))
            sock.close()
            return
        if len(self._pending) >= self.limits.max_pending:
            self._evict_oldest(
                f"more than {self.limits.max_pending} connections are waiting to authenticate "
                f"({MAX_PENDING_ENV})"
            )
        conn = _Conn(sock, now + self.limits.auth_timeout)
        self._conns[conn.fd] = conn
        self._pending[conn.fd] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _handshake(self, conn: _Conn, op: int, req: Reader) -> None:
        """HELLO then PROOF (store_protocol.py): the secret is proven, never sent."""
        if op == OP_AUTH_V1:
            self._refuse(
                conn,
                f"store protocol version mismatch: this client speaks version 1 (it sends the "
                f"secret), this store speaks version {PROTOCOL_VERSION}: run the same "
                "hvd-torch on every host",
            )
        elif op == OP_HELLO and conn.nonces is None:
            # The version first, before the rest is parsed: another version's HELLO
            # may carry other fields.
            version = req.u32()
            if version != PROTOCOL_VERSION:
                self._refuse(
                    conn,
                    f"store protocol version mismatch: this client speaks version {version}, "
                    f"this store speaks version {PROTOCOL_VERSION}: run the same hvd-torch "
                    "on every host",
                )
                return
            client_nonce = req.bytes_()
            req.end()
            if len(client_nonce) != NONCE_BYTES:
                raise Malformed(f"a HELLO's nonce must be {NONCE_BYTES} bytes")
            nonce = os.urandom(NONCE_BYTES)
            conn.nonces = (client_nonce, nonce)
            proof = server_proof(self.secret, PROTOCOL_VERSION, client_nonce, nonce)
            self._reply(
                conn,
                bytes([ST_CHALLENGE]) + U32.pack(PROTOCOL_VERSION) + pack_bytes(nonce)
                + pack_bytes(proof),
            )
        elif op == OP_PROOF and conn.nonces is not None:
            proof = req.bytes_()
            req.end()
            want = client_proof(self.secret, PROTOCOL_VERSION, *conn.nonces)
            conn.nonces = None  # one proof per HELLO: no second guess on these nonces
            if not hmac.compare_digest(proof, want):
                self._refuse(conn, "bad proof: this client does not know the job's secret")
            elif self._authed >= self.limits.max_clients:
                self._refuse(conn, self._clients_full())
            else:
                del self._pending[conn.fd]
                conn.authed = True
                self._authed += 1
                self._reply(conn, bytes([ST_OK]))
        else:
            step = "PROOF" if conn.nonces is not None else "HELLO"
            self._refuse(conn, f"request (opcode {op}) where the handshake's {step} belongs")

    def _evict_oldest(self, why: str) -> None:
        # The oldest that has not begun the handshake: one between HELLO and PROOF
        # (a rank's lasts a round trip) is not pushed out by connections that only
        # connected, so a flood of idle ones costs a rank nothing.  Only when every
        # pending connection has sent a HELLO does the oldest of them go.
        pending = self._pending.values()
        victim = next((c for c in pending if c.nonces is None), None)
        if victim is None:
            victim = next(iter(pending))
        self._refuse(victim, f"{why}; this one was the oldest")

    def _clients_full(self) -> str:
        return (
            f"the store already serves {self._authed} clients, its limit ({MAX_CLIENTS_ENV}, "
            "by default 4 per rank + 64)"
        )

    def _on_event(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
            if not conn.outbuf:
                self._runnable.append(conn)  # requests that waited for this reply to go
        if mask & selectors.EVENT_READ and not conn.closed:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        # Before the handshake ends, never more than its largest frame is buffered.
        want = _RECV_CHUNK if conn.authed else AUTH_FRAME_LIMIT + 4 - len(conn.inbuf)
        try:
            data = conn.sock.recv(max(want, 1))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)  # the client is gone, or has nothing more to say
            return
        conn.inbuf += data
        if (conn.waiter is not None or conn.outbuf) and len(conn.inbuf) > self.limits.max_frame + 4:
            self._refuse(conn, "sent requests without reading the replies")
            return
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        """Handles the complete requests in conn's buffer, one at a time: a request
        waits until the previous one is answered and its reply sent."""
        while not conn.closed and conn.waiter is None and not conn.outbuf:
            buf = conn.inbuf
            if len(buf) < 4:
                return
            length = U32.unpack_from(buf)[0]
            limit = self.limits.max_frame if conn.authed else AUTH_FRAME_LIMIT
            if length == 0 or length > limit:
                self._refuse(conn, self._frame_refusal(conn, length))
                return
            if len(buf) < 4 + length:
                return
            payload = bytes(buf[4 : 4 + length])
            del buf[: 4 + length]
            try:
                self._request(conn, Reader(payload))
            except Malformed as e:
                self._refuse(conn, f"malformed request: {e}")

    def _frame_refusal(self, conn: _Conn, length: int) -> str:
        if length == 0:
            return "bad frame length 0"
        if not conn.authed:
            return (
                f"bad frame length {length}: a connection's first frames are a handshake of "
                f"at most {AUTH_FRAME_LIMIT} bytes each"
            )
        return (
            f"bad frame length {length}: larger than the store's limit of "
            f"{self.limits.max_frame} bytes ({MAX_FRAME_ENV})"
        )

    def _reply(self, conn: _Conn, payload: bytes) -> None:
        conn.outbuf += frame(payload)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.outbuf)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        del conn.outbuf[:sent]
        if bool(conn.outbuf) != conn.writing:
            conn.writing = bool(conn.outbuf)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self._selector.modify(conn.sock, events, conn)

    def _refuse(self, conn: _Conn, message: str) -> None:
        """ERROR (sent if the socket takes it at once) and close."""
        _try_send(conn.sock, error_reply(message))
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        if conn.waiter is not None:
            self._end_wait(conn)
        del self._conns[conn.fd]
        if conn.authed:
            self._authed -= 1
        else:
            del self._pending[conn.fd]
        self._selector.unregister(conn.sock)
        conn.sock.close()

    # -- requests

    def _request(self, conn: _Conn, req: Reader) -> None:
        op = req.u8()
        if not conn.authed:
            self._handshake(conn, op, req)
            return

        if op == OP_SET:
            key, value = req.str_(), req.bytes_()
            req.end()
            self._put(key, value)
            self._reply(conn, bytes([ST_OK]))
        elif op == OP_GET:
            key, timeout_ms = req.str_(), req.u32()
            req.end()
            self._wait(conn, [key], True, timeout_ms)
        elif op == OP_WAIT:
            keys = req.strs(req.u32())
            timeout_ms = req.u32()
            req.end()
            self._wait(conn, keys, False, timeout_ms)
        elif op == OP_ADD:
            key, delta = req.str_(), req.i64()
            req.end()
            old = self._data.get(key, I64.pack(0))
            if len(old) != 8:
                self._reply(
                    conn, error_reply(f"ADD on key {key!r} whose value is not an 8-byte integer")
                )
                return
            new = I64.unpack(old)[0] + delta
            if not -(1 << 63) <= new < (1 << 63):
                self._reply(conn, error_reply(f"ADD on key {key!r} overflows int64"))
                return
            self._put(key, I64.pack(new))
            self._reply(conn, bytes([ST_INT]) + I64.pack(new))
        elif op == OP_DELETE:
            key = req.str_()
            req.end()
            with self._data_lock:
                self._data.pop(key, None)
            self._reply(conn, bytes([ST_OK]))
        elif op == OP_CHECK:
            keys = req.strs(req.u32())
            req.end()
            present = all(k in self._data for k in keys)
            self._reply(conn, bytes([ST_INT]) + I64.pack(int(present)))
        elif op == OP_LIST:
            prefix = req.str_()
            req.end()
            keys = sorted(k for k in self._data if k.startswith(prefix))
            self._reply(conn, bytes([ST_KEYS]) + pack_strs(keys))
        else:
            raise Malformed(f"unknown opcode {op}")

    def _put(self, key: str, value: bytes) -> None:
        with self._data_lock:
            self._data[key] = value
        for conn in self._watch.pop(key, ()):
            waiter = conn.waiter
            if waiter is None:  # answered earlier in this loop (a reply that failed)
                continue
            waiter.missing.discard(key)
            if waiter.missing:
                continue
            # A key this waiter saw earlier may have been deleted since.
            missing = {k for k in waiter.keys if k not in self._data}
            if missing:
                waiter.missing = missing
                for k in missing:
                    self._watch.setdefault(k, set()).add(conn)
                continue
            self._end_wait(conn)
            self._answer(conn, waiter)
            self._runnable.append(conn)

    def _wait(self, conn: _Conn, keys: list[str], get: bool, timeout_ms: int) -> None:
        """Answers GET/WAIT now if it can, else parks it until its keys exist."""
        missing = [k for k in keys if k not in self._data]
        if not missing or timeout_ms == 0:
            if missing:
                self._reply(conn, bytes([ST_TIMEOUT]) + pack_strs(missing))
            else:
                self._answer(conn, _Waiter(keys, get, set(), None))
            return
        deadline = None
        if timeout_ms != WAIT_FOREVER_MS:
            deadline = time.monotonic() + timeout_ms / 1000
        conn.waiter = _Waiter(keys, get, set(missing), deadline)
        for k in conn.waiter.missing:
            self._watch.setdefault(k, set()).add(conn)
        if deadline is not None:
            self._timed += 1
            heapq.heappush(self._timers, (deadline, next(self._seq), conn, conn.waiter))
            if len(self._timers) > 2 * self._timed + 64:
                # Answered waiters leave their entries behind; a client that asks a lot
                # with long timeouts must not grow the heap without bound.
                self._timers = [t for t in self._timers if t[2].waiter is t[3]]
                heapq.heapify(self._timers)

    def _end_wait(self, conn: _Conn) -> None:
        waiter, conn.waiter = conn.waiter, None
        if waiter.deadline is not None:
            self._timed -= 1
        for k in waiter.missing:
            watchers = self._watch.get(k)
            if watchers is not None:
                watchers.discard(conn)
                if not watchers:
                    del self._watch[k]

    def _answer(self, conn: _Conn, waiter: _Waiter) -> None:
        """The reply to a GET or WAIT whose keys all exist."""
        if waiter.get:
            self._reply(conn, bytes([ST_VALUE]) + pack_bytes(self._data[waiter.keys[0]]))
        else:
            self._reply(conn, bytes([ST_OK]))


def _try_send(sock: socket.socket, payload: bytes) -> None:
    """One non-blocking send of a small frame; whatever does not go at once is dropped."""
    try:
        sock.send(frame(payload))
    except OSError:
        pass
