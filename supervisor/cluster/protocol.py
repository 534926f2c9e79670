"""The group's one message, both ways: what a rank says of itself. JSON over the status port
(`GET /cluster?beat=<JSON>`: a rank's beat in the query, since the status server reads request heads
only; the primary's own beat in the answer). States and
numbers only: nothing here is a secret, and nothing of the model travels this way."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["GONE", "PATH", "UP", "Beat", "decode"]

PATH = "/cluster"
UP = ("HEALTHY", "SELFTEST", "SERVING")      # a rank whose engine is up
GONE = ("FAILED", "STOPPING", "STOPPED")     # a rank that will not launch again by itself
_MAX_BODY = 4096


@dataclass(frozen=True)
class Beat:
    rank: int
    state: str            # its supervisor's lifecycle state
    running: bool         # an engine of its own runs
    epoch: int            # the primary: its engine's launch count; another rank: the one its engine joined
    waiting: bool = False  # at its launch gate, with no engine: ready to launch in order
    failure: str = ""     # the class of its last failure, when FAILED

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def decode(body: bytes, nodes: int) -> Beat:
    """A beat, or ValueError saying what is wrong with it."""
    if len(body) > _MAX_BODY:
        raise ValueError(f"beat of {len(body)} bytes (at most {_MAX_BODY})")
    data = json.loads(body.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("beat is not a JSON object")
    rank, epoch = data.get("rank"), data.get("epoch")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nodes:
        raise ValueError(f"rank {rank!r} is not one of 0 .. {nodes - 1}")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch {epoch!r} is not a whole number")
    return Beat(rank=rank, state=str(data.get("state", "?"))[:20], running=data.get("running") is True, epoch=epoch,
                waiting=data.get("waiting") is True, failure=str(data.get("failure") or "")[:40])
