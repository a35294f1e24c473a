"""The store's handshake over a raw socket, for tests that speak its wire format by
hand (pipelined requests, frames the client never sends): the same HELLO and PROOF
as hvdrun/store.py, each step's bytes kept so a test can replay or inspect them."""

from __future__ import annotations

import os
import socket
import struct

from hvdrun.store_protocol import (
    NONCE_BYTES, OP_HELLO, OP_PROOF, PROTOCOL_VERSION, ST_CHALLENGE, U32, Reader, client_proof,
    frame, pack_bytes, server_proof,
)  # fmt: skip


def read_reply(sock: socket.socket) -> bytes | None:
    """One reply frame's payload, or None if the server closed (or reset) first."""
    try:
        header = sock.recv(4, socket.MSG_WAITALL)
        if len(header) < 4:
            return None
        return sock.recv(struct.unpack("<I", header)[0], socket.MSG_WAITALL)
    except OSError:
        return None


def hello(nonce: bytes | None = None, version: int = PROTOCOL_VERSION) -> bytes:
    """A HELLO frame with the given (else a fresh) client nonce."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    return frame(bytes([OP_HELLO]) + U32.pack(version) + pack_bytes(nonce))


def handshake(sock: socket.socket, secret: bytes) -> list[bytes]:
    """Runs the client's side on sock, checking the server's proof; returns the two
    frames this client sent (HELLO, PROOF).  AssertionError when a step fails."""
    nonce = os.urandom(NONCE_BYTES)
    first = hello(nonce)
    sock.sendall(first)
    reply = read_reply(sock)
    assert reply is not None and reply[0] == ST_CHALLENGE, reply
    body = Reader(reply[1:])
    version, server_nonce, proof = body.u32(), body.bytes_(), body.bytes_()
    assert version == PROTOCOL_VERSION
    assert proof == server_proof(secret, version, nonce, server_nonce)
    second = frame(
        bytes([OP_PROOF]) + pack_bytes(client_proof(secret, version, nonce, server_nonce))
    )
    sock.sendall(second)
    assert read_reply(sock) == b"\x00"
    return [first, second]
