"""What a Slurm job step tells hvdrun about its nodes (per-node mode defaults).

Under `srun --ntasks-per-node=1 hvdrun ... python train.py`, every node's hvdrun
reads its place in the job from Slurm's variables, so no per-node flag is needed.
"""

from __future__ import annotations

import re

from .config import Slurm

__all__ = ["DEFAULT_PORT_BASE", "expand_hostlist", "in_job_step", "node_defaults"]

DEFAULT_PORT_BASE = 29400  # torchrun's default rendezvous port
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def in_job_step(environ=None) -> bool:
    """True inside `srun` (a job step), not in the batch script itself."""
    return Slurm.from_environment(environ).in_job_step


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: "node[01-03,07],gpu5" -> node01 node02 node03
    node07 gpu5 (zero padding kept)."""
    hosts: list[str] = []
    for entry in _split_top_level(text):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", entry)
        if match is None:
            if "[" in entry or "]" in entry:
                raise ValueError(f"cannot parse Slurm host list entry {entry!r}")
            hosts.append(entry)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            r = _RANGE.match(part.strip())
            if r is None:
                raise ValueError(f"cannot parse range {part!r} in Slurm host list {text!r}")
            first, last = r.group(1), r.group(2) or r.group(1)
            width = len(first)
            for n in range(int(first), int(last) + 1):
                hosts.append(f"{prefix}{n:0{width}d}{suffix}")
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Splits on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def node_defaults(environ=None) -> dict[str, str]:
    """Per-node option values (launch.parse_args's keys) from SLURM_* variables (in
    environ, None: os.environ); empty outside a job step.  Flags given on the command
    line win over these."""
    slurm = Slurm.from_environment(environ)
    if not slurm.in_job_step:
        return {}
    out: dict[str, str] = {}
    if slurm.nodes:
        out["nnodes"] = slurm.nodes
    out["node_rank"] = slurm.nodeid
    if slurm.node_list:
        first = expand_hostlist(slurm.node_list)[0]
        job_id = slurm.job_number()
        # One port per job, so that two jobs sharing a first node do not collide.
        out["rdzv_endpoint"] = f"{first}:{DEFAULT_PORT_BASE + job_id % 1000}"
    return out
