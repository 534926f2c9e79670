"""What machine is this, and is it the one the deploy config was made for?

The field notes' costliest surprise was a placement run on the wrong machine: a 5-GPU pod picked up the
2-GPU placement before the guard existed, and the host's vCPU, not its VRAM, set the speed
(16 vCPU ~2.9 tok/s against 41 vCPU ~5.4 tok/s, same placement). So the probe reads GPUs *and*
the container's real CPU and RAM, and `check` turns every difference from [hardware] into one
line that says what was expected, what was found and what to do.

GPUs come from NVML (pynvml), else from `nvidia-smi`, else there are none: a CPU host is a valid
answer, never an exception. vCPU and RAM are cgroup-aware, because inside a container
/proc/cpuinfo and MemTotal describe the host, not the slice of it the pod was sold.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import HardwareSpec

__all__ = ["GPU", "Hardware", "probe", "gpu_memory_used_mib", "check", "host_resident_warning",
           "gpu_summary"]

MIB = 1024 * 1024
GIB = 1024 ** 3

SMI_FIELDS = ("index", "name", "memory.total", "memory.used", "memory.free", "compute_cap", "uuid",
              "driver_version")
SMI_TIMEOUT_S = 20.0        # a cold driver without persistence mode can take seconds per GPU
SMI_FAST_TIMEOUT_S = 10.0   # the reclaim barrier polls; a hung nvidia-smi must not stall it long
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX * page size (9223372036854771712 on x86-64),
# and a quota of -1; anything at least this large is no limit.
_UNLIMITED_BYTES = 1 << 60
# What nvidia-smi prints for a value it cannot give.
_SMI_NA = ("", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]",
           "[GPU requires reset]", "[GPU is lost]")


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_total_mib: int
    memory_free_mib: int
    memory_used_mib: int
    compute_capability: str | None   # "8.6"; None when the driver would not say
    uuid: str | None = None


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[GPU, ...]
    driver: str | None
    source: str                 # "nvml" | "nvidia-smi" | "none"
    vcpus: float                # min(cgroup CPU quota, CPUs we may run on)
    ram_total_gib: float        # min(cgroup memory limit, MemTotal)
    ram_available_gib: float    # min(headroom under the cgroup limit, MemAvailable)
    # Why GPU discovery came back empty or partial (e.g. "NVML: NVML Shared Library Not Found;
    # nvidia-smi: not found"), so a refusal can say which layer was missing. None when clean.
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gpus"] = [dict(g) for g in d["gpus"]]
        d["gpu_count"] = len(self.gpus)
        return d


# --------------------------------------------------------------------------- GPUs
def _text(v: str | bytes) -> str:
    # Older pynvml returned bytes; nvidia-ml-py >= 11.5 returns str.
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _nvml_memory(pynvml: Any, handle: Any) -> Any:
    # v2 reports `used` without the driver's reservation, as nvidia-smi >= R510 does, so both
    # sources agree; v1 (old drivers have no v2 entry point) counts the reservation as used.
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except (pynvml.NVMLError, AttributeError, TypeError):
        return pynvml.nvmlDeviceGetMemoryInfo(handle)


def _nvml_gpus(memory_only: bool = False) -> tuple[list[GPU], str | None]:
    """GPUs and driver version from NVML. Raises ImportError or pynvml.NVMLError on any failure."""
    import pynvml  # deferred: importing is cheap, but a broken install must not break the supervisor

    pynvml.nvmlInit()
    try:
        driver = None if memory_only else _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = _nvml_memory(pynvml, h)
            if memory_only:
                gpus.append(GPU(i, "", mem.total // MIB, mem.free // MIB, mem.used // MIB, None))
                continue
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                cc: str | None = f"{major}.{minor}"
            except pynvml.NVMLError:
                cc = None
            try:
                uuid: str | None = _text(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError:
                uuid = None
            gpus.append(GPU(index=i, name=_text(pynvml.nvmlDeviceGetName(h)),
                            memory_total_mib=mem.total // MIB, memory_free_mib=mem.free // MIB,
                            memory_used_mib=mem.used // MIB, compute_capability=cc, uuid=uuid))
        return gpus, driver
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _nvidia_device_nodes() -> bool:
    """Worth trying NVML: a driver's device nodes exist, or pynvml is already loaded (no import cost)."""
    return ("pynvml" in sys.modules or os.path.exists("/dev/nvidiactl")
            or os.path.exists("/proc/driver/nvidia/version"))


def _nvml_error(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return "NVML: pynvml (nvidia-ml-py) is not installed"
    return f"NVML: {e or type(e).__name__}"


def _run_smi(nvidia_smi: str, fields: Sequence[str], timeout: float) -> tuple[list[str] | None, str]:
    """The CSV lines of `nvidia-smi --query-gpu`, or None and why not."""
    argv = [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout,
                           check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return None, f"nvidia-smi: {nvidia_smi} not found"
    except PermissionError:
        return None, f"nvidia-smi: {nvidia_smi} is not executable"
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi: no answer within {timeout:g}s"
    except OSError as e:
        return None, f"nvidia-smi: {e.strerror or e}"
    if r.returncode != 0:
        # nvidia-smi writes its failures ("couldn't communicate with the NVIDIA driver",
        # "No devices were found") to stdout; keep the first line that says something.
        said = next((ln.strip() for ln in (r.stdout + "\n" + r.stderr).splitlines() if ln.strip()),
                    "no output")
        return None, f"nvidia-smi: exit {r.returncode}: {said}"
    return [ln for ln in r.stdout.splitlines() if ln.strip()], ""


def _smi_value(v: str) -> str | None:
    v = v.strip()
    return None if v in _SMI_NA or (v.startswith("[") and v.endswith("]")) else v


def _smi_mib(v: str) -> int | None:
    s = _smi_value(v)
    if s is None:
        return None
    s = s.removesuffix("MiB").strip()   # in case a caller's nvidia-smi ignores `nounits`
    try:
        return int(float(s))
    except ValueError:
        return None


def _smi_split(line: str, n: int) -> list[str] | None:
    """Split one CSV row into n fields; a comma inside the name (field 1) is put back together."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < n:
        return None
    extra = len(parts) - n
    return [parts[0], ", ".join(parts[1:2 + extra])] + parts[2 + extra:]


def _parse_smi(lines: list[str], fields: Sequence[str]) -> tuple[list[GPU], str | None, list[str]]:
    gpus: list[GPU] = []
    driver: str | None = None
    skipped: list[str] = []
    for line in lines:
        row = _smi_split(line, len(fields))
        rec = dict(zip(fields, row)) if row else {}
        idx = _smi_value(rec.get("index", ""))
        total = _smi_mib(rec.get("memory.total", ""))
        if row is None or idx is None or not idx.isdigit() or total is None:
            skipped.append(line.strip())
            continue
        used = _smi_mib(rec.get("memory.used", "")) or 0
        free = _smi_mib(rec.get("memory.free", ""))
        gpus.append(GPU(index=int(idx), name=_smi_value(rec.get("name", "")) or "unknown GPU",
                        memory_total_mib=total, memory_used_mib=used,
                        memory_free_mib=max(total - used, 0) if free is None else free,
                        compute_capability=_smi_value(rec.get("compute_cap", "")),
                        uuid=_smi_value(rec.get("uuid", ""))))
        driver = driver or _smi_value(rec.get("driver_version", ""))
    return gpus, driver, skipped


def _smi_gpus(nvidia_smi: str, timeout: float) -> tuple[list[GPU] | None, str | None, str]:
    fields: Sequence[str] = SMI_FIELDS
    lines, why = _run_smi(nvidia_smi, fields, timeout)
    if lines is None and "compute_cap" in why and "not a valid field" in why:
        # Drivers before R510 reject the compute_cap field outright; ask again without it.
        fields = tuple(f for f in SMI_FIELDS if f != "compute_cap")
        lines, why = _run_smi(nvidia_smi, fields, timeout)
    if lines is None:
        return None, None, why
    gpus, driver, skipped = _parse_smi(lines, fields)
    note = f"nvidia-smi: skipped unparseable line(s): {skipped[:3]}" if skipped else ""
    return gpus, driver, note


# --------------------------------------------------------------------------- CPU and RAM
def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _own_cgroup(sysroot: Path, controller: str | None) -> str:
    """Our cgroup path from /proc/self/cgroup: the v2 entry when controller is None."""
    text = _read(sysroot / "proc/self/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if (controller is None and controllers == "") or \
                (controller is not None and controller in controllers.split(",")):
            return path
    return "/"


def _cgroup_dirs(sysroot: Path, controller: str | None) -> list[Path]:
    """Every directory whose limits bind us: our own cgroup and its ancestors up to the mount root.

    In a container with its own cgroup namespace the path is "/" and only the root is read. Where
    the host's hierarchy is mounted (as on this dev box), the limits sit on our cgroup or one of
    its parents, and the tightest one wins. A path that doesn't exist under the mount (a v1 bind
    mount of just our cgroup) leaves the mount root, which is then ours.
    """
    base = sysroot / "sys/fs/cgroup"
    if controller is None:
        # v2: unified at the top, or under unified/ on a hybrid host.
        mounts = [m for m in (base, base / "unified") if (m / "cgroup.controllers").exists()]
    else:
        mounts = [base / controller] if (base / controller).is_dir() else []
    dirs: list[Path] = []
    for mount in mounts:
        rel = Path(_own_cgroup(sysroot, controller).lstrip("/"))
        for p in (rel, *rel.parents):
            d = mount / p
            if d.is_dir() and d not in dirs:
                dirs.append(d)
    return dirs


def _cgroup_cpu_limit(sysroot: Path) -> float | None:
    """The tightest CPU quota, in CPUs, over v2 cpu.max and v1 cfs quota; None = unlimited."""
    limits: list[float] = []
    for d in _cgroup_dirs(sysroot, None):
        parts = (_read(d / "cpu.max") or "").split()
        if len(parts) == 2 and parts[0] != "max":
            try:
                quota, period = int(parts[0]), int(parts[1])
            except ValueError:
                continue
            if quota > 0 and period > 0:
                limits.append(quota / period)
    for d in _cgroup_dirs(sysroot, "cpu"):
        try:
            quota = int(_read(d / "cpu.cfs_quota_us") or "-1")
            period = int(_read(d / "cpu.cfs_period_us") or "0")
        except ValueError:
            continue
        if quota > 0 and period > 0:   # -1 = no quota
            limits.append(quota / period)
    return min(limits) if limits else None


def _parse_cpu_list(text: str) -> int:
    """Count the CPUs in a kernel list like "0-15,32-47"."""
    n = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


def _affinity(sysroot: Path) -> int:
    """CPUs this process may run on (cpuset and taskset included, unlike os.cpu_count)."""
    if sysroot != Path("/"):
        # A fixture tree says its own: the same list the kernel gives in /proc/self/status.
        for line in (_read(sysroot / "proc/self/status") or "").splitlines():
            if line.startswith("Cpus_allowed_list:"):
                try:
                    return _parse_cpu_list(line.split(":", 1)[1])
                except ValueError:
                    break
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1


def _meminfo(sysroot: Path) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in (_read(sysroot / "proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None   # "max" (v2 no limit) lands here


def _stat(path: Path, *keys: str) -> int:
    """First of keys found in a memory.stat file, else 0."""
    values: dict[str, str] = {}
    for line in (_read(path) or "").splitlines():
        k, _, v = line.partition(" ")
        values[k] = v
    for k in keys:
        if (n := _int(values.get(k))) is not None:
            return n
    return 0


def _cgroup_memory(sysroot: Path) -> tuple[int | None, int | None]:
    """(tightest memory limit, least headroom under a limit), bytes; None where no limit is set.

    Headroom is the limit minus the working set (usage less inactive file cache, the figure
    docker stats and the kubelet use): page cache of a mapped model is reclaimable and would
    otherwise make a loaded pod look full.
    """
    limits: list[int] = []
    headroom: list[int] = []
    candidates = [(d, "memory.max", "memory.current", ("inactive_file",))
                  for d in _cgroup_dirs(sysroot, None)]
    candidates += [(d, "memory.limit_in_bytes", "memory.usage_in_bytes",
                    ("total_inactive_file", "inactive_file")) for d in _cgroup_dirs(sysroot, "memory")]
    for d, limit_file, usage_file, inactive in candidates:
        limit = _int(_read(d / limit_file))
        if limit is None or limit <= 0 or limit >= _UNLIMITED_BYTES:
            continue
        limits.append(limit)
        usage = _int(_read(d / usage_file))
        if usage is not None:
            working = max(usage - _stat(d / "memory.stat", *inactive), 0)
            headroom.append(max(limit - working, 0))
    return (min(limits) if limits else None), (min(headroom) if headroom else None)


def _gib(n: float) -> float:
    return round(n / GIB, 2)


def _memory(root: Path) -> tuple[int, int]:
    """(total, available) bytes: MemTotal/MemAvailable, each capped by the tightest cgroup."""
    info = _meminfo(root)
    limit, headroom = _cgroup_memory(root)
    total = info.get("MemTotal", 0)
    avail = info.get("MemAvailable", info.get("MemFree", 0))
    if limit is not None:
        total = min(total, limit) if total else limit
    if headroom is not None:
        avail = min(avail, headroom) if avail else headroom
    return total, avail


def ram_available_bytes(sysroot: str = "/") -> int:
    """The memory this container may still fill (MemAvailable, capped by its cgroup's headroom),
    without probing the GPUs: the model prefetch asks it before the first engine starts."""
    return _memory(Path(sysroot))[1]


# --------------------------------------------------------------------------- probe
def visible_gpus(gpus: Sequence[GPU], visible: str) -> list[GPU]:
    """The GPUs CUDA_VISIBLE_DEVICES lets the engine use (indices or UUID prefixes, in that order).

    NVML and nvidia-smi list every GPU the driver shows the container; the engine sees only
    these, so the guard must count these. CUDA stops at the first entry it cannot resolve.
    """
    kept: list[GPU] = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            break
        match = next((g for g in gpus if (token.isdigit() and g.index == int(token))
                      or (g.uuid and token.startswith("GPU-") and g.uuid.startswith(token))), None)
        if match is None or match in kept:
            break
        kept.append(match)
    return kept


def probe(*, sysroot: str = "/", nvidia_smi: str = "nvidia-smi", use_nvml: bool = True,
          visible: str | None = None) -> Hardware:
    """Read this machine. Never raises for a missing GPU or driver: a CPU host is an answer.

    `visible` defaults to $CUDA_VISIBLE_DEVICES (unset = every GPU)."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    notes: list[str] = []
    gpus: list[GPU] | None = None
    driver: str | None = None
    source = "none"
    if use_nvml and not _nvidia_device_nodes():
        # No driver device nodes: NVML cannot work, and importing it costs ~30 ms of every boot.
        notes.append("NVML: no NVIDIA device nodes (/dev/nvidiactl, /proc/driver/nvidia)")
    elif use_nvml:
        try:
            gpus, driver = _nvml_gpus()
            source = "nvml"
        except Exception as e:  # NVMLError (no library, driver not loaded, GPU lost) or ImportError
            notes.append(_nvml_error(e))
    if gpus is None:
        gpus, driver, why = _smi_gpus(nvidia_smi, SMI_TIMEOUT_S)
        if gpus is not None:
            source = "nvidia-smi"
        if why:
            notes.append(why)

    if gpus and visible is not None:
        kept = visible_gpus(gpus, visible)
        if len(kept) != len(gpus):
            notes.append(f"CUDA_VISIBLE_DEVICES={visible!r}: {len(kept)} of {len(gpus)} GPUs visible to the engine")
        gpus = kept

    root = Path(sysroot)
    quota = _cgroup_cpu_limit(root)
    cpus = float(_affinity(root))
    vcpus = min(cpus, quota) if quota is not None else cpus

    total, avail = _memory(root)

    return Hardware(gpus=tuple(gpus or ()), driver=driver, source=source,
                    vcpus=round(vcpus, 2), ram_total_gib=_gib(total), ram_available_gib=_gib(avail),
                    note="; ".join(notes) or None)


def gpu_memory_used_mib(use_nvml: bool = True, nvidia_smi: str = "nvidia-smi") -> list[int] | None:
    """Used MiB per GPU, by index, for the ladder's reclaim barrier; None = no GPUs or unknown.

    Only memory is asked for, so a poll costs one NVML round trip (or one short nvidia-smi run).
    """
    if use_nvml and _nvidia_device_nodes():
        try:
            gpus, _ = _nvml_gpus(memory_only=True)
            return [g.memory_used_mib for g in gpus] or None
        except Exception:  # same fallbacks as probe(): no NVML is not an error here
            pass
    lines, _ = _run_smi(nvidia_smi, ("index", "memory.used"), SMI_FAST_TIMEOUT_S)
    if lines is None:
        return None
    used: dict[int, int] = {}
    for line in lines:
        row = _smi_split(line, 2)
        mib = _smi_mib(row[1]) if row else None
        if row is None or not row[0].isdigit() or mib is None:
            return None   # a GPU we can't read makes the whole answer unknown, not optimistic
        used[int(row[0])] = mib
    return [used[i] for i in sorted(used)] or None


# --------------------------------------------------------------------------- check
def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _num(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def gpu_summary(hw: Hardware) -> str:
    """"NVIDIA A40 x5", or "NVIDIA A40 x4, NVIDIA L40S x1" on a mixed pod."""
    counts: dict[str, int] = {}
    for g in hw.gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in counts.items())


def _no_gpu_reason(hw: Hardware) -> str:
    if hw.source == "none":
        why = "no NVIDIA driver: NVML and nvidia-smi unavailable"
        return f"{why}; {hw.note}" if hw.note else why
    return f"driver {hw.driver or '?'} sees no GPU via {hw.source}; is the container started with GPUs?"


def _cc_tuple(cc: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in cc.strip().split("."))
    except ValueError:
        return None


def check(spec: HardwareSpec, hw: Hardware) -> list[str]:
    """Every way hw falls short of spec, one line each: expected, found, fix. Empty = matches."""
    out: list[str] = []
    found = len(hw.gpus)
    if spec.gpu_count is not None and spec.gpu_count != found:
        want = spec.gpu_count
        if want == 0:
            out.append(f"gpu_count: expected exactly 0 GPUs (CPU only), found {found} "
                       f"({gpu_summary(hw)}): this config would leave them idle; set KILN_GPU_COUNT "
                       f"or use a config made for {found}")
        elif found == 0:
            out.append(f"gpu_count: expected exactly {_plural(want, 'GPU')}, found none "
                       f"({_no_gpu_reason(hw)}): run on a pod with {_plural(want, 'GPU')} "
                       f"exposed to the container, or use a CPU config (gpu_count = 0)")
        elif found > want:
            # The field notes' accident: 5 GPUs ran the 2-GPU placement; it worked, but not as planned.
            out.append(f"gpu_count: expected exactly {_plural(want, 'GPU')}, found {found} "
                       f"({gpu_summary(hw)}): this config's placement was made for {want}; "
                       f"set KILN_GPU_COUNT or use a config made for {found}")
        else:
            out.append(f"gpu_count: expected exactly {_plural(want, 'GPU')}, found {found} "
                       f"({gpu_summary(hw)}): this config's placement needs {want}; "
                       f"run on a pod with {want} or use a config made for {found}")
    # Per-GPU fields: with no GPU at all the gpu_count line already says so, when there is one.
    gpu_fields_apply = found > 0 or spec.gpu_count is None
    if spec.min_vram_mib is not None and gpu_fields_apply:
        if not hw.gpus:
            out.append(f"min_vram_mib: expected GPUs of at least {spec.min_vram_mib} MiB, found none "
                       f"({_no_gpu_reason(hw)}): run on a GPU pod or use a CPU config")
        short = [g for g in hw.gpus if g.memory_total_mib < spec.min_vram_mib]
        if short:
            which = ", ".join(f"GPU {g.index} ({g.name}) has {g.memory_total_mib} MiB" for g in short)
            out.append(f"min_vram_mib: expected at least {spec.min_vram_mib} MiB on every GPU, "
                       f"{which}: run on GPUs with at least {spec.min_vram_mib} MiB or use a config "
                       f"made for {min(g.memory_total_mib for g in short)} MiB cards")
    if spec.min_compute_capability is not None and gpu_fields_apply:
        want_cc = _cc_tuple(spec.min_compute_capability)
        if want_cc is None:
            out.append(f"min_compute_capability: {spec.min_compute_capability!r} is not a version "
                       f"like \"8.6\": fix the config")
        elif not hw.gpus:
            out.append(f"min_compute_capability: expected GPUs of at least "
                       f"{spec.min_compute_capability}, found none ({_no_gpu_reason(hw)}): run on a "
                       f"GPU pod or use a CPU config")
        else:
            bad = []
            for g in hw.gpus:
                have = _cc_tuple(g.compute_capability) if g.compute_capability else None
                if have is None:
                    bad.append(f"GPU {g.index} ({g.name}) did not report one (driver "
                               f"{hw.driver or '?'} is too old to say)")
                elif have < want_cc:
                    bad.append(f"GPU {g.index} ({g.name}) is {g.compute_capability}")
            if bad:
                out.append(f"min_compute_capability: expected at least "
                           f"{spec.min_compute_capability} on every GPU, {', '.join(bad)}: run on "
                           f"newer GPUs or use a build and config made for these")
    if spec.min_vcpu is not None and hw.vcpus < spec.min_vcpu:
        out.append(f"min_vcpu: expected at least {spec.min_vcpu} vCPU, found {_num(hw.vcpus)} "
                   f"(cgroup quota and CPU affinity): rent a pod with more vCPU (RunPod scales vCPU "
                   f"with GPU count) or use a config made for this host")
    if spec.min_ram_gib is not None and hw.ram_total_gib < spec.min_ram_gib:
        out.append(f"min_ram_gib: expected at least {_num(spec.min_ram_gib)} GiB of RAM, found "
                   f"{hw.ram_total_gib:.1f} GiB (container limit or MemTotal, whichever is less): "
                   f"rent a pod with more RAM or use a config made for this host")
    return out


def host_resident_warning(spec: HardwareSpec, hw: Hardware, host_resident_gib: float) -> str | None:
    """A warning when too few vCPU serve the weights kept in host RAM; None when there are enough.

    Not a refusal: the placement runs, it is just CPU-bound. The field notes' same placement decoded at
    ~2.9 tok/s with 16 vCPU and ~5.4 tok/s with 41 vCPU for ~80 GB of host-resident weights, which
    is where the default threshold (0.4 vCPU per GiB) comes from.
    """
    threshold = spec.warn_vcpu_per_host_gib
    if threshold <= 0 or host_resident_gib <= 0:
        return None
    ratio = hw.vcpus / host_resident_gib
    if ratio >= threshold:
        return None
    need = math.ceil(threshold * host_resident_gib)
    return (f"host CPU will likely bound decode: {_num(hw.vcpus)} vCPU for {host_resident_gib:.1f} GiB "
            f"of host-resident weights is {ratio:.2f} vCPU/GiB, below {threshold:g} "
            f"(hardware.warn_vcpu_per_host_gib). The field notes ran the same placement at ~2.9 tok/s "
            f"with 16 vCPU and ~5.4 tok/s with 41 vCPU (1.9x). Keep more of the model in VRAM, "
            f"or rent a pod with at least {need} vCPU (RunPod scales vCPU with GPU count)")
