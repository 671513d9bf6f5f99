"""What this host can run: devices, GPUs and versions. Runs in a child via the runner."""

from __future__ import annotations

import functools
import platform
import shutil
import socket
import subprocess
from typing import Any

import torch


def driver_version(allow_subprocess: bool = True) -> str | None:
    """The NVIDIA driver's version from NVML, or nvidia-smi; None where neither answers."""
    try:
        import pynvml  # nvidia-ml-py: optional

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if not allow_subprocess or smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.strip().splitlines()
    return lines[0].strip() if lines else None


@functools.cache
def _host() -> dict[str, Any]:
    # platform.platform() reads the interpreter's binary to find the libc: milliseconds
    # that every experiment paid. Nothing here changes while the worker runs.
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def host_info() -> dict[str, Any]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    host = _host()
    return {
        "torch": host["torch"],
        "cuda": host["cuda"],
        "cudnn": cudnn,
        "hostname": host["hostname"],
        "python": host["python"],
        "platform": host["platform"],
    }


# The forkserver imports this module (through workers.child): each child inherits the
# answers instead of asking again. None of it starts CUDA.
_host()


def capabilities() -> dict[str, Any]:
    # is_available() asks the driver without creating a context: the probe stays cheap.
    has_cuda = torch.cuda.is_available()
    gpus = []
    if has_cuda:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                {"index": index, "name": props.name, "total_memory": int(props.total_memory)}
            )
    return {
        "device_types": ["cpu", "cuda"] if has_cuda else ["cpu"],
        "gpus": gpus,
        **host_info(),
        "driver": driver_version() if has_cuda else None,
    }
