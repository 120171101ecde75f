"""Device memory as the driver sees it (what ``nvidia-smi`` shows), through NVML.

PyTorch's counters (``memory_allocated``/``memory_reserved``) only see its caching allocator; the
CUDA context, cuBLAS/cuDNN handles outside the allocator and CUDA managed memory (bitsandbytes'
paged optimizers) are only visible to the driver. NVML reports, per device, the memory each
compute process uses (``nvmlDeviceGetComputeRunningProcesses`` -> ``usedGpuMemory``) and the
device's total used memory (``nvmlDeviceGetMemoryInfo``). Source: NVIDIA NVML API reference,
"Device Queries" (docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html); Python bindings
``nvidia-ml-py`` (module ``pynvml``).

Inside containers NVML may list host PIDs that differ from ``os.getpid()``; then the process is not
found and the device-wide figure is used instead. The source is recorded with each figure
(``nvml-process`` or ``nvml-device``) because the device-wide one includes other processes.
"""

from __future__ import annotations

import os


class Nvml:
    """One NVML session bound to the device that CUDA calls ``cuda:0`` in this process."""

    def __init__(self, uuid: str | None = None):
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        handle = None
        if uuid:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError:
                handle = None
        if handle is None:
            # CUDA_VISIBLE_DEVICES renumbers devices for CUDA, not for NVML
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else 0
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.handle = handle
        self.pid = os.getpid()

    def process_used(self) -> tuple[int | None, str]:
        """``(bytes, source)``: this process's device memory, else the whole device's used memory."""
        nv = self._nv
        try:
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if proc.pid == self.pid and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory), "nvml-process"
        except nv.NVMLError:
            pass
        try:
            return int(nv.nvmlDeviceGetMemoryInfo(self.handle).used), "nvml-device"
        except nv.NVMLError:
            return None, "unavailable"

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library we no longer need
            pass


def uuid_of(props) -> str | None:
    """NVML's spelling (``GPU-xxxxxxxx-...``) of a ``torch.cuda`` device's UUID."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML (no driver, no bindings): the field stays null
        return None


def nvidia_gpus_present() -> tuple[bool | None, str]:
    """Whether the driver reports any NVIDIA GPU, asked through NVML, so a process can check
    without importing torch or creating a CUDA context. ``None`` when NVML bindings are missing."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - pynvml raises NVMLError subclasses per cause
        return False, f"NVML could not start ({exc}): no NVIDIA driver?"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return (count > 0), f"{count} NVIDIA GPU(s)"
