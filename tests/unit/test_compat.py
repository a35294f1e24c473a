"""docs/compat.md is true: every name marked same/differs is exported with that argument order."""

import inspect
import re
from pathlib import Path

import hvd_torch as hvd

COMPAT = Path(__file__).resolve().parents[2] / "docs" / "compat.md"
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<status>[^|]+) \| (?P<args>[^|]*) \|")


def _rows():
    rows = [m.groupdict() for line in COMPAT.read_text().splitlines() if (m := ROW.match(line))]
    assert len(rows) > 60, "the compat table looks truncated"
    return rows


def test_every_same_or_differing_name_is_exported_with_horovods_argument_order():
    for row in _rows():
        status = row["status"].strip()
        if status not in ("same", "differs"):
            continue
        assert hasattr(hvd, row["name"]), f"{row['name']} is marked {status} but not exported"
        args = row["args"].strip().strip("`")
        if args:
            want = [a.strip() for a in args.split(",")]
            have = list(inspect.signature(getattr(hvd, row["name"])).parameters)
            assert have[: len(want)] == want, (row["name"], have, want)


def test_names_marked_missing_are_really_missing():
    # A name that now exists must have its row updated.
    for row in _rows():
        if row["status"].strip() in ("not yet", "not provided"):
            assert not hasattr(hvd, row["name"]), f"{row['name']} exists: update docs/compat.md"
