"""The rendezvous store's wire format, shared by its server (store_server.py) and its
Python client (store.py); the C++ client (csrc/core/store_client.cc) depends on every
byte of it.

Binary, little-endian.  Every message in both directions is a frame: u32 payload
length, then payload.  Request payload: u8 opcode, then arguments.  bytes/str are
u32 length + raw bytes; integers are fixed-width.
    9 HELLO(version u32, client nonce bytes)
                                    -> CHALLENGE(version u32, server nonce bytes,
                                       server proof bytes), or ERROR and close
   10 PROOF(client proof bytes)     -> OK, or ERROR and the server closes
    2 SET(key, value)               -> OK (wakes waiters)
    3 GET(key, timeout_ms u32)      -> VALUE(value) or TIMEOUT([key])
    4 WAIT(n u32, keys.., timeout_ms u32) -> OK or TIMEOUT(missing keys)
    5 ADD(key, delta i64)           -> INT(new value); stored as 8-byte LE i64
    6 DELETE(key)                   -> OK
    7 CHECK(n u32, keys..)          -> INT(1) if all exist else INT(0)
    8 LIST(prefix)                  -> KEYS(existing keys starting with prefix)
Reply payload: u8 status then body: 0 OK; 1 VALUE(bytes); 2 TIMEOUT(u32 n, n strs);
3 ERROR(str); 4 INT(i64); 5 KEYS(u32 n, n strs); 6 CHALLENGE(u32 version, bytes,
bytes).  timeout_ms 0xFFFFFFFF means wait forever.

The handshake (PROTOCOL_VERSION 2) proves, both ways, that each side knows the job's
secret without sending it: the client sends HELLO with a fresh 32-byte nonce; the
server answers its own fresh nonce and
    server proof = HMAC-SHA256(secret, "hvd-torch store server" | version u32 |
                               client nonce | server nonce)
which the client checks (in constant time) before it says anything else: a server
that cannot prove it (something else listening on the port) learns nothing and is
refused.  The client then sends
    client proof = HMAC-SHA256(secret, "hvd-torch store client" | version u32 |
                               client nonce | server nonce)
which the server checks in constant time.  The two purposes keep one side's proof
from serving as the other's; fresh nonces on both sides make a recorded handshake
worthless (its proof is over a server nonce no later connection gets).  Cost: two
round trips, 172 bytes.  Version 1 sent the secret itself (opcode 1, AUTH): a
version-1 client is refused with an ERROR naming both versions, as is a HELLO of any
other version; the client names both versions when the CHALLENGE's differs.

HELLO and PROOF must come first, each in a frame of at most AUTH_FRAME_LIMIT bytes,
both within the server's auth deadline; a request before them, a larger frame, a late
one, or a malformed frame gets ERROR and the connection is closed.  Only an authenticated
connection may send larger frames, up to the server's frame limit (StoreLimits in
store_server.py).  A client sends one request and reads its reply before the next.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct

__all__ = [
    "AUTH_FRAME_LIMIT",
    "I64",
    "OP_ADD",
    "OP_AUTH_V1",
    "OP_CHECK",
    "OP_DELETE",
    "OP_GET",
    "OP_HELLO",
    "OP_LIST",
    "OP_PROOF",
    "PROTOCOL_VERSION",
    "NONCE_BYTES",
    "OP_SET",
    "OP_WAIT",
    "ST_CHALLENGE",
    "ST_ERROR",
    "ST_INT",
    "ST_KEYS",
    "ST_OK",
    "ST_TIMEOUT",
    "ST_VALUE",
    "U32",
    "WAIT_FOREVER_MS",
    "Malformed",
    "Reader",
    "StoreAuthError",
    "StoreError",
    "StoreTimeout",
    "client_proof",
    "error_reply",
    "frame",
    "make_secret",
    "pack_bytes",
    "pack_str",
    "pack_strs",
    "recv_exact",
    "secret_from_hex",
    "secret_to_hex",
    "server_proof",
]

# OP_AUTH_V1 is version 1's AUTH(secret): recognized only to refuse it by name.
OP_AUTH_V1, OP_SET, OP_GET, OP_WAIT, OP_ADD, OP_DELETE, OP_CHECK, OP_LIST = range(1, 9)
OP_HELLO, OP_PROOF = 9, 10
ST_OK, ST_VALUE, ST_TIMEOUT, ST_ERROR, ST_INT, ST_KEYS, ST_CHALLENGE = range(7)
WAIT_FOREVER_MS = 0xFFFFFFFF
PROTOCOL_VERSION = 2
NONCE_BYTES = 32
# The largest frame before the handshake ends (a HELLO or a PROOF is under 50 bytes);
# the same 4 KiB version 1 allowed its AUTH.
AUTH_FRAME_LIMIT = 4096
_SERVER_PURPOSE = b"hvd-torch store server"
_CLIENT_PURPOSE = b"hvd-torch store client"

U32 = struct.Struct("<I")
I64 = struct.Struct("<q")


class StoreError(RuntimeError):
    """The store could not be reached, refused a request, or went away."""


class StoreAuthError(StoreError):
    """The handshake failed: the server refused us, or could not prove it knows the
    job's secret, or speaks another protocol version."""


class StoreTimeout(StoreError):
    """Keys did not appear in time.  ``keys`` lists the ones still missing."""

    def __init__(self, keys, address, timeout):
        self.keys = list(keys)
        self.address = address
        self.timeout = timeout
        super().__init__(
            f"timed out after {timeout:g}s waiting for keys {self.keys} in the store at {address}"
        )


class Malformed(StoreError):
    """A frame that does not parse; on the client side this surfaces as StoreError."""


def _proof(purpose: bytes, secret: bytes, version: int, client_nonce: bytes,
           server_nonce: bytes) -> bytes:
    message = purpose + U32.pack(version) + client_nonce + server_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


def server_proof(secret: bytes, version: int, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """What the server sends to prove it knows the secret (see the module's text)."""
    return _proof(_SERVER_PURPOSE, secret, version, client_nonce, server_nonce)


def client_proof(secret: bytes, version: int, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """What the client sends to prove it knows the secret."""
    return _proof(_CLIENT_PURPOSE, secret, version, client_nonce, server_nonce)


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


def job_secret_from_hex(text: str, where: str) -> bytes:
    """A secret the user gave (HVD_TORCH_SECRET, a secret file): hex of at least 16
    bytes; ValueError naming where it came from."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise ValueError(f"{where}: the secret must be hex digits") from None
    if len(secret) < 16:
        raise ValueError(f"{where}: the secret must be at least 16 bytes (32 hex digits)")
    return secret


def pack_bytes(data: bytes) -> bytes:
    return U32.pack(len(data)) + data


def pack_str(text: str) -> bytes:
    return pack_bytes(text.encode("utf-8"))


def pack_strs(items) -> bytes:
    return U32.pack(len(items)) + b"".join(pack_str(s) for s in items)


def frame(payload: bytes) -> bytes:
    return U32.pack(len(payload)) + payload


def error_reply(message: str) -> bytes:
    return bytes([ST_ERROR]) + pack_str(message)


class Reader:
    """Cursor over one frame's payload; running past the end is Malformed."""

    def __init__(self, payload: bytes):
        self._buf = memoryview(payload)
        self._pos = 0

    def take(self, n: int) -> bytes:
        if n > len(self._buf) - self._pos:
            raise Malformed("truncated frame")
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return U32.unpack(self.take(4))[0]

    def i64(self) -> int:
        return I64.unpack(self.take(8))[0]

    def bytes_(self) -> bytes:
        return self.take(self.u32())

    def str_(self) -> str:
        try:
            return self.bytes_().decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed("key is not valid UTF-8") from None

    def strs(self, n: int) -> list[str]:
        # Each key needs at least its 4-byte length, so a huge n in a small frame is
        # rejected before we loop over it.
        if n * 4 > len(self._buf) - self._pos:
            raise Malformed("key count larger than the frame")
        return [self.str_() for _ in range(n)]

    def end(self) -> None:
        if self._pos != len(self._buf):
            raise Malformed("trailing bytes after the request")


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """n bytes from a blocking socket, or None if the peer closed cleanly before the
    first byte."""
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
