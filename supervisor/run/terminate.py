"""A pod that can never serve ends itself (the Failed and Serving effects, and the loop's exit): on
RunPod with [runpod] terminate_on_terminal_failure, FAILED arms a termination after a grace
(fleet/self_terminate.py; on a cluster node rank 0 deletes the cluster: fleet/cluster_terminate.py);
a published config that brings it back to SERVING cancels it; leaving FAILED for good
(exit_on_failure) lets the termination go first, any other exit cancels it."""

from __future__ import annotations

from typing import Any, Mapping

from ..config import SelfTerminateSpec
from .record import Record


class Terminator:
    def __init__(self, env: Mapping[str, str], rec: Record):
        self.env, self.rec = env, rec
        self.armed: Any = None         # fleet/ Termination (a cluster node's: ClusterTermination), while FAILED

    def failed(self, spec: SelfTerminateSpec, why: str) -> None:
        if self.armed is None and spec.terminate_on_terminal_failure:
            from ..fleet import cluster_terminate      # a single pod: fleet/self_terminate.py

            self.armed = cluster_terminate.arm(spec, self.env, failure=why, on_event=self.rec.event,
                                               on_change=self._changed)
            if self.armed is not None:
                self.rec.update(runpod_terminate=self.armed.to_dict())

    def _changed(self, handle: Any) -> None:
        """From the termination's thread: the cluster found, the outcome known."""
        if self.armed is None or handle is self.armed:
            self.rec.update(runpod_terminate=handle.to_dict())

    def serving(self) -> None:
        """A published config brought it back: keep the pod."""
        if self.armed is not None:
            self.armed.cancel()
            self.rec.update(runpod_terminate=self.armed.to_dict())
            self.armed = None

    def leave(self, *, failed_for_good: bool) -> None:
        if self.armed is None:
            return
        if failed_for_good:
            self.armed.wait(self.armed.grace_s + 60.0)
        else:
            self.armed.cancel()
