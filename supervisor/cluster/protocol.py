"""The group's one message, both ways: what a rank says of itself. JSON over the group's own port on the
cluster's private network (listen.py: `GET /cluster?beat=<JSON>`, a rank's beat in the query; the
primary's own beat in the answer). States and numbers only: nothing of the model travels this way.

Every beat is sealed (Seal): an HMAC-SHA256, keyed by the cluster's secret (KILN_CLUSTER_SECRET, made
by `cluster up`), over the cluster's name and every field, with the sender's boot id, a sequence number
and its clock. A beat is refused when its seal is not the secret's (a stranger: one forged beat used to
fail the whole group), when its clock is more than MAX_SKEW_S from ours (an old one), or when it is not
newer than the last one taken from that rank (a replay): the same boot with a higher sequence, or a new
boot (a restarted rank) with a later clock."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["GONE", "MAX_SKEW_S", "PATH", "UP", "Beat", "Seal", "decode"]

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
    awaiting: str = ""    # the primary at its gate: the ranks it waits for ("rank 2 never arrived")

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


MAX_SKEW_S = 60.0      # a beat's clock this far from the receiver's: old (or the nodes' clocks are apart)


class Seal:
    """Signs this node's beats and opens the others' (one per node: its boot id and sequence are its own)."""

    def __init__(self, secret: str, cluster: str = "", clock: Callable[[], float] = time.time):
        if not secret:
            raise ValueError("no cluster secret: beats cannot be sealed")
        self._key = secret.encode()
        self._cluster = cluster
        self._clock = clock
        self.boot = secrets.token_hex(8)
        self._seq = 0
        self._lock = threading.Lock()
        self._last: dict[int, tuple[str, int, float]] = {}      # rank -> (boot, seq, t) last taken

    def _mac(self, fields: dict) -> str:
        text = json.dumps({"cluster": self._cluster, **fields}, sort_keys=True, separators=(",", ":"))
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def seal(self, beat: Beat) -> bytes:
        with self._lock:
            self._seq += 1
            fields = {**asdict(beat), "boot": self.boot, "seq": self._seq, "t": round(self._clock(), 3)}
        return json.dumps({**fields, "mac": self._mac(fields)}, sort_keys=True).encode()

    def open(self, body: bytes, nodes: int) -> Beat:
        """The beat, or ValueError saying why it is refused (forged, old, replayed or malformed)."""
        if len(body) > _MAX_BODY:
            raise ValueError(f"beat of {len(body)} bytes (at most {_MAX_BODY})")
        data = json.loads(body.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("beat is not a JSON object")
        mac = data.pop("mac", "")
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(data)):
            raise ValueError("its seal is not this cluster's (no KILN_CLUSTER_SECRET, or another one): refused")
        boot, seq, t = data.pop("boot", None), data.pop("seq", None), data.pop("t", None)
        if not (isinstance(boot, str) and isinstance(seq, int) and isinstance(t, (int, float))):
            raise ValueError("a sealed beat without its boot, seq and t")
        now = self._clock()
        if abs(now - t) > MAX_SKEW_S:
            raise ValueError(f"its clock is {now - t:+.0f} s from this node's (more than {MAX_SKEW_S:g} s): an old "
                             "beat, or the nodes' clocks are apart")
        beat = decode(json.dumps(data).encode(), nodes)
        with self._lock:
            last = self._last.get(beat.rank)
            if last is not None and ((boot == last[0] and seq <= last[1]) or (boot != last[0] and t <= last[2])):
                raise ValueError(f"rank {beat.rank}'s beat replayed (seq {seq}, not newer than the last taken)")
            self._last[beat.rank] = (boot, seq, t)
        return beat


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
                waiting=data.get("waiting") is True, failure=str(data.get("failure") or "")[:40],
                awaiting=str(data.get("awaiting") or "")[:300])
