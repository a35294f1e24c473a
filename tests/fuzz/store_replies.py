"""Writes the store client fuzz target's seeds (tests/fuzz/corpus/store_client/) with
the server's own encoders (hvdrun/store_protocol.py): a count of ops, the ops, then the
replies a store sends them, AUTH's first.  Run by `make -C tests/fuzz corpus`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hvdrun.store_protocol import (
    I64, ST_ERROR, ST_INT, ST_KEYS, ST_OK, ST_TIMEOUT, ST_VALUE, error_reply, frame, pack_bytes,
    pack_strs,
)  # fmt: skip

# The target's op numbers (fuzz_store_client.cc).
SET, GET, WAIT, ADD, DELETE, CHECK, LIST = range(7)
OK = frame(bytes([ST_OK]))


def seed(ops, replies):
    return bytes([len(ops)]) + bytes(ops) + OK + b"".join(frame(r) for r in replies)


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
    "refused": bytes([1, GET]) + frame(error_reply("bad secret")),
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
