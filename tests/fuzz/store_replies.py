"""Writes the store client fuzz target's seeds (tests/fuzz/corpus/store_client/) with
the server's own encoders (hvdrun/store_protocol.py): a count of ops, the ops, then the
replies a store sends them, the handshake's first (a CHALLENGE proven over the target's
fixed client nonce, and OK to its PROOF).  Run by `make -C tests/fuzz corpus`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hvdrun.store_protocol import (
    I64, PROTOCOL_VERSION, ST_CHALLENGE, ST_ERROR, ST_INT, ST_KEYS, ST_OK, ST_TIMEOUT, ST_VALUE,
    U32, error_reply, frame, pack_bytes, pack_strs, server_proof,
)  # fmt: skip

# The target's op numbers (fuzz_store_client.cc).
SET, GET, WAIT, ADD, DELETE, CHECK, LIST = range(7)
OK = frame(bytes([ST_OK]))
# The target's secret and client nonce (kSecret, kNonce).
SECRET, CLIENT_NONCE, SERVER_NONCE = b"secret", b"n" * 32, bytes(range(32))


def challenge(proof=None, version=PROTOCOL_VERSION):
    if proof is None:
        proof = server_proof(SECRET, version, CLIENT_NONCE, SERVER_NONCE)
    return frame(bytes([ST_CHALLENGE]) + U32.pack(version) + pack_bytes(SERVER_NONCE)
                 + pack_bytes(proof))


def seed(ops, replies, opening=None):
    opening = challenge() + OK if opening is None else opening
    return bytes([len(ops)]) + bytes(ops) + opening + b"".join(frame(r) for r in replies)


SEEDS = {
    "every_op": seed(
        [SET, GET, WAIT, ADD, DELETE, CHECK, LIST],
        [bytes([ST_OK]), bytes([ST_VALUE]) + pack_bytes(b"value"), bytes([ST_OK]),
         bytes([ST_INT]) + I64.pack(7), bytes([ST_OK]), bytes([ST_INT]) + I64.pack(1),
         bytes([ST_KEYS]) + pack_strs(["k/1", "k/2"])],
    ),
    "timeouts": seed(
        [GET, WAIT],
        [bytes([ST_TIMEOUT]) + pack_strs(["key"]), bytes([ST_TIMEOUT]) + pack_strs(["a", "b"])],
    ),
    "errors": seed([SET, ADD], [error_reply("no"), error_reply("ADD on key 'n' overflows int64")]),
    "refused": bytes([1, GET]) + frame(error_reply("bad proof")),
    "proof_refused": seed([GET], [], opening=challenge() + frame(error_reply("bad proof"))),
    "forged_proof": seed([SET], [bytes([ST_OK])], opening=challenge(proof=b"\0" * 32) + OK),
    "other_version": seed([SET], [bytes([ST_OK])], opening=challenge(version=3) + OK),
    "squatter_ok": seed([SET], [bytes([ST_OK])], opening=OK),
    "cut": seed([GET, LIST], [bytes([ST_VALUE]) + pack_bytes(b"v")])[:-2],
    "wrong_status": seed([CHECK, LIST], [bytes([ST_ERROR]) + b"\x01", bytes([ST_OK])]),
}


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS.items():
        (folder / name).write_bytes(data)


if __name__ == "__main__":
    main(sys.argv[1])
