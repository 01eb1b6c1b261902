"""Which devices the payload reports on, who they are, and the software stack they run on.

On CUDA the GPUs are NVML's (``gpu`` is the NVML index: the node's numbering, as ``nvidia-smi`` and DCGM
show it). Torch's devices are matched to them by UUID (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is set before
CUDA starts, so the order agrees too, for a torch too old to report UUIDs). A GPU NVML sees but torch
cannot use keeps its identity and gets ``error`` rows for its steps; without NVML, torch's devices stand
in. Every row of one node carries one ``gpu_model`` (the contract: one node, one model), the most common
of its devices', ``unknown`` when nothing names one.

The stack record is a flat JSON object of component → version strings (what ``gpucert baseline build
--stack`` reads), ``gpucert`` among them (a change of benchmark is a change of stack), and the boards'
serials (an acceptance certificate names each GPU by it). A component that cannot be read is left out,
never guessed.
"""

from __future__ import annotations

import collections
import os
import platform
import socket
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ._nvml import NvmlUnavailable, describe, open_nvml, text
from ._rows import Device
from ._torch_steps import StepUnavailable, load_torch

__all__ = ["Discovery", "discover", "stack_record"]


@dataclass
class Discovery:
    kind: str  # "cuda" or "cpu"
    devices: dict[int, Device] = field(default_factory=dict)
    model: str = "unknown"
    nvml: Any = None
    #: why NVML cannot be used, when it cannot
    nvml_reason: str | None = None
    nvml_count: int | None = None
    #: gpu index → NVML handle, for the GPUs NVML sees (CUDA only: CPU devices have none)
    handles: dict[int, Any] = field(default_factory=dict)
    torch: Any = None
    #: why no torch step can run at all (no torch, or no CUDA), when none can
    torch_reason: str | None = None
    #: gpu index → why NVML could not describe that GPU
    gpu_problems: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def discover(
    kind: str, *, cpu_devices: int = 2, hostname: str | None = None, nvml_module: Any = None, use_nvml: bool = True
) -> Discovery:
    """Find the devices: NVML first (identity, telemetry), then torch (what can be benchmarked)."""
    host = hostname or socket.gethostname()
    found = Discovery(kind)
    if kind == "cuda":
        # Before CUDA starts in this process (and in the ranks it spawns): number devices as NVML does.
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if use_nvml:
        _nvml_devices(found, nvml_module)
    else:
        found.nvml_reason = "telemetry skipped (--skip telemetry)"
    try:
        found.torch = load_torch()
    except StepUnavailable as exc:
        found.torch_reason = str(exc)
    if kind == "cpu":
        usable = found.torch is not None
        found.devices = {i: Device(i, f"CPU-{host}-{i}", "cpu", i if usable else None) for i in range(cpu_devices)}
        found.model = "cpu"
        if found.nvml is not None:
            found.notes.append("--device cpu: NVML telemetry of this machine's GPUs is not attributed to CPU devices")
        return found
    nvml_devices = found.devices
    torch_devices = _torch_devices(found)
    by_uuid = {uuid: j for j, (uuid, _name) in torch_devices.items() if uuid}
    devices: dict[int, Device] = {}
    for i, dev in nvml_devices.items():
        j = by_uuid.get(dev.uuid or "")
        if j is None and not by_uuid and len(torch_devices) == len(nvml_devices):
            j = i  # a torch without UUIDs: same order (PCI bus id) and count
        devices[i] = Device(i, dev.uuid, dev.model, j)
    matched = {d.torch_index for d in devices.values()}
    for j, (uuid, name) in torch_devices.items():
        if j not in matched:
            index = j if found.nvml is None else max(devices, default=-1) + 1
            if found.nvml is not None:
                found.notes.append(
                    f"torch device {j} ({uuid}) is not among the GPUs NVML sees: reported as GPU {index}"
                )
            devices[index] = Device(index, uuid, name, j)
    found.devices = devices
    models = collections.Counter(d.model for d in devices.values() if d.model and d.model != "unknown")
    if models:
        found.model = models.most_common(1)[0][0]
        if len(models) > 1:
            found.notes.append(f"GPUs of several models {dict(models)}: every row says {found.model!r}")
    return found


def _nvml_devices(found: Discovery, module: Any) -> None:
    try:
        nvml = open_nvml(module)
    except NvmlUnavailable as exc:
        found.nvml_reason = str(exc)
        return
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        found.nvml_reason = f"NVML cannot count the GPUs: {describe(exc)}"
        return
    found.nvml, found.nvml_count = nvml, count
    if found.kind != "cuda":
        return
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:
            found.gpu_problems[i] = f"NVML cannot open GPU {i}: {describe(exc)}"
            found.devices[i] = Device(i, None, "unknown")
            continue
        found.handles[i] = handle
        uuid: str | None = None
        model = "unknown"
        try:
            uuid = text(nvml.nvmlDeviceGetUUID(handle))
            model = text(nvml.nvmlDeviceGetName(handle))
        except Exception as exc:
            found.gpu_problems[i] = f"NVML cannot identify GPU {i}: {describe(exc)}"
        found.devices[i] = Device(i, uuid, model)


def _torch_devices(found: Discovery) -> dict[int, tuple[str | None, str]]:
    """torch index → (UUID ``GPU-…`` or None, name); sets ``torch_reason`` when CUDA is unusable."""
    torch = found.torch
    if torch is None:
        return {}
    try:
        available = bool(torch.cuda.is_available())
        count = int(torch.cuda.device_count()) if available else 0
    except Exception as exc:
        available, count = False, 0
        found.notes.append(f"torch cannot query CUDA: {describe(exc)}")
    if not available or count == 0:
        found.torch_reason = (
            f"CUDA is not available to torch {torch.__version__} (built for CUDA {torch.version.cuda}); "
            "no GPU can be benchmarked"
        )
        return {}
    out: dict[int, tuple[str | None, str]] = {}
    for j in range(count):
        try:
            props = torch.cuda.get_device_properties(j)
        except Exception as exc:
            found.notes.append(f"torch cannot describe CUDA device {j}: {describe(exc)}")
            continue
        raw = getattr(props, "uuid", None)
        uuid = None if raw is None else ("GPU-" + str(raw) if not str(raw).startswith("GPU-") else str(raw))
        out[j] = (uuid, str(props.name))
    return out


def stack_record(found: Discovery, node: str, hostname: str | None = None) -> dict[str, str]:
    """The versions this run was made on: a flat object of strings (see the module's docstring)."""
    record: dict[str, str] = {
        "node": node,
        "hostname": hostname or socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpucert": __version__,
        "gpu_model": found.model,
    }
    nvml = found.nvml
    if nvml is not None:
        for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2")):
            try:
                value = getattr(nvml, fn)()
            except Exception:
                continue
            if key == "cuda_driver" and isinstance(value, int):
                record[key] = f"{value // 1000}.{value % 1000 // 10}"
            else:
                record[key] = text(value)
        for index, handle in sorted(found.handles.items()):
            try:
                record[f"vbios.{index}"] = text(nvml.nvmlDeviceGetVbiosVersion(handle))
            except Exception:
                continue
            try:  # the board serial (NOT_SUPPORTED on some boards): what an acceptance certificate names
                record[f"serial.{index}"] = text(nvml.nvmlDeviceGetSerial(handle))
            except Exception:
                continue
    torch = found.torch
    if torch is not None:
        record["torch"] = str(torch.__version__)
        if torch.version.cuda:
            record["cuda"] = str(torch.version.cuda)
        try:
            nccl = torch.cuda.nccl.version()
            record["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
    return record
