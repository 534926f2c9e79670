"""What runs "in" a stand-in pod.

SupervisorRunner runs a real Kiln supervisor (`python -m supervisor` + the pod's `args`, the
image's ENTRYPOINT and CMD) with the env RunPod would give the container. A real pod has its own
network namespace, so its supervisor listens on 8080/8081/8082; several pods on one loopback
cannot, so the runner maps each private port to a free loopback port and points the supervisor's
port variables at them (as Docker's port mapping would, seen from inside). Mounts become
directories under the runner's workdir (a bind mount, seen from inside): env values under a
mount path are rewritten to the host directory. The deploy config the image would bake comes
from the test (`config_for(pod, volume_dir)`) and reaches the supervisor as KILN_CONFIG, unless the
pod carries its own (KILN_DEPLOY_CONFIG, from `up --config`): then the image's file system is what
`image_paths` maps (the engine's binary and flag snapshot at the image's paths, /opt/kiln/engine/...,
are this machine's), written into the carried config's [server] where it leaves them to the image.

NullRunner is a container that is up at once and runs nothing, for tests of the API alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..supervised import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# The supervisor's port variables and the private port each has in Kiln's images.
PORT_ENV = {"KILN_SERVER_PORT": 8080, "KILN_STATUS_PORT": 8081, "KILN_TCP_PORT": 8082}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _runtime_ports(ports: list[str], mapped: dict[int, int]) -> list[dict[str, Any]]:
    out = []
    for spec in ports:
        num, _, proto = spec.partition("/")
        private = int(num)
        if proto == "tcp":
            out.append({"private": private, "public": mapped.get(private), "type": "tcp", "ip": "127.0.0.1"})
        else:
            out.append({"private": private, "public": None, "type": "http", "ip": None})
    return out


class NullContainer:
    def __init__(self, ports: list[str]):
        self.mapped = {int(p.split("/")[0]): free_port() for p in ports}

    def listening(self) -> bool:
        return True

    def exited(self) -> bool:
        return False

    def lines(self) -> list[tuple[str, str]]:
        return []

    def runtime_ports(self, ports: list[str]) -> list[dict[str, Any]]:
        return _runtime_ports(ports, self.mapped)

    def stop(self) -> None:
        pass


class NullRunner:
    def start(self, pod: dict[str, Any], env: dict[str, str]) -> NullContainer:
        return NullContainer(pod.get("ports") or [])


Container = Any   # NullContainer or SupervisedContainer: listening, exited, lines, runtime_ports, stop, mapped


class SupervisedContainer:
    def __init__(self, proc: subprocess.Popen, log_path: Path, mapped: dict[int, int]):
        self.proc = proc
        self.log_path = log_path
        self.mapped = mapped
        self._seen: list[tuple[str, str]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def listening(self) -> bool:
        for port in self.mapped.values():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return True
            except OSError:
                continue
        return False

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def lines(self) -> list[tuple[str, str]]:
        """The container's output so far, each line stamped when first read."""
        with self._lock:
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(self._offset)
                    chunk = f.read()
            except OSError:
                chunk = b""
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._offset += len(complete)
            stamp = _now()
            self._seen += [(stamp, line) for line in complete.decode(errors="replace").splitlines()]
            return list(self._seen)

    def runtime_ports(self, ports: list[str]) -> list[dict[str, Any]]:
        return _runtime_ports(ports, self.mapped)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the container's process group (the supervisor stops its engine), then SIGKILL."""
        import psutil

        if self.proc.poll() is not None:
            return
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        leftovers = [p for p in tree if p.is_running()]
        for p in leftovers:            # engines run in their own sessions: not in the group
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(leftovers, timeout=10)


class SupervisorRunner:
    """Starts a real supervisor per pod. `config_for(pod, volume_dir)` returns the deploy config
    TOML the image would bake (volume_dir: the host directory behind the pod's mount, or None)."""

    def __init__(self, workdir: Path, config_for: Callable[[dict[str, Any], Path | None], str],
                 extra_env: dict[str, str] | None = None, image_paths: dict[str, str] | None = None):
        self.workdir = workdir
        self.config_for = config_for
        self.extra_env = dict(extra_env or {})
        self.image_paths = dict(image_paths or {})
        self.started: list[SupervisedContainer] = []

    @staticmethod
    def _state_dir(carried: str, home: Path, volume: tuple[str, Path] | None) -> str:
        """The carried config's state_dir on this machine: under the pod's mount when it is there (the
        volume's host directory), else in the container's own directory; never the path itself."""
        import tomllib

        from supervisor import deploy_env
        from supervisor.errors import KilnError

        try:
            state = str(tomllib.loads(deploy_env.decode(carried)).get("state_dir", "/workspace/kiln"))
        except (tomllib.TOMLDecodeError, KilnError):
            state = "/workspace/kiln"
        if volume and (state == volume[0] or state.startswith(volume[0].rstrip("/") + "/")):
            return str(volume[1]) + state[len(volume[0].rstrip("/")):]
        return str(home / "container-fs" / state.lstrip("/"))

    def _image_view(self, carried: str) -> str:
        """The carried deploy config as this machine runs the image: where its [server] leaves the engine's
        binary or flag snapshot to the image's default path, that path as `image_paths` maps it."""
        import tomllib

        from supervisor import deploy_env
        from supervisor.config import DEFAULT_BINARIES, DEFAULT_SNAPSHOTS

        from supervisor.errors import KilnError

        try:
            text = deploy_env.decode(carried)
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, KilnError):
            return carried                          # the supervisor says what is wrong with it
        engine, server = str(data.get("engine", "llamacpp")), data.get("server") or {}
        lines = [f"{key} = {json.dumps(self.image_paths[default])}"
                 for key, default in (("binary", DEFAULT_BINARIES.get(engine, "")),
                                      ("flag_snapshot", DEFAULT_SNAPSHOTS.get(engine, "")))
                 if key not in server and default in self.image_paths]
        if not lines:
            return carried
        head = "[server]\n"
        text = text.replace(head, head + "\n".join(lines) + "\n", 1) if head in text else \
            text + "\n" + head + "\n".join(lines) + "\n"
        return deploy_env.encode(text)

    def _volume_dir(self, pod: dict[str, Any]) -> tuple[str, Path] | None:
        mounts = pod.get("mounts") or {}
        if mounts.get("persistent"):
            return mounts["persistent"]["path"], self.workdir / pod["id"] / "volume"
        for m in mounts.get("network") or []:
            return m["path"], self.workdir / "network-volumes" / m["volumeId"]
        return None

    def start(self, pod: dict[str, Any], env: dict[str, str]) -> SupervisedContainer:
        home = self.workdir / pod["id"]
        home.mkdir(parents=True, exist_ok=True)
        mapped = {int(p.split("/")[0]): free_port() for p in pod.get("ports") or []}
        volume = self._volume_dir(pod)
        if volume:
            volume[1].mkdir(parents=True, exist_ok=True)
        cfg = home / "deploy.toml"
        cfg.write_text(self.config_for(pod, volume[1] if volume else None))
        full = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "RUNPOD_", "HF_"))}
        full.update({"PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1", **self.extra_env})
        for k, v in env.items():
            if volume and (v == volume[0] or v.startswith(volume[0].rstrip("/") + "/")):
                v = str(volume[1]) + v[len(volume[0].rstrip("/")):]
            full[k] = v
        for name, private in PORT_ENV.items():
            if private in mapped:
                full[name] = str(mapped[private])
        if full.get("KILN_DEPLOY_CONFIG"):          # the deployment's own config, not the image's
            full["KILN_DEPLOY_CONFIG"] = self._image_view(full["KILN_DEPLOY_CONFIG"])
            if "KILN_STATE_DIR" not in full:        # its state_dir, as the container's file system holds it
                full["KILN_STATE_DIR"] = self._state_dir(full["KILN_DEPLOY_CONFIG"], home, volume)
        else:
            full["KILN_CONFIG"] = str(cfg)
        log_path = home / "container.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "supervisor", *str(pod.get("args") or "").split()],
                                    stdout=log, stderr=subprocess.STDOUT, env=full, cwd=REPO_ROOT,
                                    start_new_session=True)
        container = SupervisedContainer(proc, log_path, mapped)
        self.started.append(container)
        return container
