"""Device discovery: the one seam between the worker and its GPUs.

:func:`discover` lists the worker's accelerators as :class:`~gpulayer.contracts.Device`
records. Real GPUs come from NVML (``pynvml``, imported only when discovery runs, so
``import gpulayer`` stays light). Tests and laptops simulate GPUs with the environment
variable ``GPULAYER_SIMULATED_GPUS``::

    GPULAYER_SIMULATED_GPUS="2xA100-80GB,1xH100-80GB"   # three GPUs, indices 0..2
    GPULAYER_SIMULATED_GPUS="T4-16GB"                   # the count prefix is optional
    GPULAYER_SIMULATED_GPUS="2xrocm:MI250-64GB"         # another kind: rocm, mps
    GPULAYER_SIMULATED_GPUS=""                          # no GPUs, even on a GPU machine

Without the variable, discovery tries NVIDIA (NVML), then AMD (``rocm-smi`` JSON,
else the amdgpu sysfs tree), then Apple MPS (asks a ``python -c
"import torch"`` subprocess on macOS, so the worker itself never imports torch).
Finding nothing is normal, never an error. Inside a Slurm allocation
(``SLURM_JOB_ID`` set) only the GPUs Slurm gave the job count: those its
``CUDA_VISIBLE_DEVICES`` (or ``HIP``/``ROCR_VISIBLE_DEVICES``) names, by index or
UUID, since NVML lists every GPU of the node whatever the allocation holds
(:func:`allocated`). :class:`GpuTelemetry` reads utilization,
memory, temperature and power at each heartbeat.

The CPU is not a device: the registration describes it with ``cpus`` and
``memory_bytes``.
"""

import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from gpulayer.contracts import Accelerator, Device

log = logging.getLogger(__name__)

SIMULATED_GPUS_ENV = "GPULAYER_SIMULATED_GPUS"

_GIB = 1024**3
_ITEM = re.compile(
    r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?:(?P<kind>cuda|rocm|mps):)?"
    r"(?P<model>.+?)-(?P<memory>\d+(?:\.\d+)?)\s*GB$"
)
_KINDS: dict[str, Accelerator] = {"cuda": "cuda", "rocm": "rocm", "mps": "mps"}
#: Compute capabilities of common NVIDIA models, so simulated GPUs can be matched
#: by ``min_compute_capability`` like real ones.
_COMPUTE_CAPABILITY = {
    "H200": "9.0",
    "H100": "9.0",
    "GH200": "9.0",
    "L40S": "8.9",
    "L40": "8.9",
    "L4": "8.9",
    "RTX4090": "8.9",
    "A100": "8.0",
    "A30": "8.0",
    "A10": "8.6",
    "A10G": "8.6",
    "RTX3090": "8.6",
    "A40": "8.6",
    "T4": "7.5",
    "V100": "7.0",
    "P100": "6.0",
}
_MODEL = re.compile(r"^[A-Za-z0-9][\w.\- ]*$")
_ACCEPTED = (
    "use a comma-separated list of [COUNTx][KIND:]MODEL-MEMORYGB,"
    " e.g. '2xA100-80GB,1xH100-80GB', 'T4-16GB' or '1xrocm:MI250-64GB'"
)


def discover() -> list[Device]:
    """The GPUs of this machine: simulated ones when ``GPULAYER_SIMULATED_GPUS`` is set,
    else NVIDIA's (NVML), else AMD's, else Apple's MPS, else none.

    Raises
    ------
    ValueError
        If ``GPULAYER_SIMULATED_GPUS`` is set but malformed; the message shows the
        accepted form.
    """
    simulated = os.environ.get(SIMULATED_GPUS_ENV)
    if simulated is not None:
        return allocated(parse_simulated(simulated))
    return allocated(nvml_devices() or _rocm_devices() or _mps_devices())


def allocated(devices: list[Device]) -> list[Device]:
    """``devices`` less those a Slurm allocation did not give this job (see the module
    docstring); all of them outside Slurm or when Slurm names none."""
    if "SLURM_JOB_ID" not in os.environ:
        return devices
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        visible = os.environ.get(var)
        if visible is not None:
            names = {v.strip() for v in visible.split(",") if v.strip()}
            return [d for d in devices if str(d.index) in names or (d.uuid or "") in names]
    return devices


def parse_simulated(value: str) -> list[Device]:
    """Simulated devices from a ``GPULAYER_SIMULATED_GPUS`` value such as ``"2xA100-80GB"``.

    Raises
    ------
    ValueError
        If an item is not ``[COUNTx][KIND:]MODEL-MEMORYGB``.
    """
    devices: list[Device] = []
    if not value.strip():
        return devices
    for item in value.split(","):
        count, kind, model, memory_bytes = _parse_item(item.strip(), value)
        vendor = {"cuda": "NVIDIA", "rocm": "AMD", "mps": "Apple"}[kind]
        for _ in range(count):
            index = len(devices)
            devices.append(
                Device(
                    index=index,
                    kind=kind,
                    name=f"{vendor} {model} (simulated)",
                    memory_bytes=memory_bytes,
                    memory_kind="unified" if kind == "mps" else "dedicated",
                    uuid=f"GPU-sim-{index}",
                    compute_capability=_COMPUTE_CAPABILITY.get(model.upper().replace(" ", ""))
                    if kind == "cuda"
                    else None,
                    simulated=True,
                )
            )
    return devices


def _parse_item(item: str, value: str) -> tuple[int, Accelerator, str, int]:
    """``(count, kind, model, memory_bytes)`` of one item, or a ValueError naming it."""
    m = _ITEM.match(item)
    model = m.group("model").strip() if m else ""
    if m is None or not _MODEL.match(model):
        raise ValueError(f"{SIMULATED_GPUS_ENV}={value!r}: cannot read {item!r}; {_ACCEPTED}")
    count = int(m.group("count") or 1)
    memory_bytes = int(float(m.group("memory")) * _GIB)
    if count < 1 or memory_bytes <= 0:
        raise ValueError(
            f"{SIMULATED_GPUS_ENV}={value!r}: {item!r} needs a count and memory above 0;"
            f" {_ACCEPTED}"
        )
    return count, _KINDS[m.group("kind") or "cuda"], model, memory_bytes


def nvml_devices() -> list[Device]:
    """The GPUs NVML reports; none (never an error) when there is no driver or no pynvml."""
    try:
        import pynvml  # lazily: `import gpulayer` must not load it
    except ImportError:
        log.debug("pynvml is not installed; no GPUs")
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.debug("NVML is not available (%s); no GPUs", e)
        return []
    try:
        return [_nvml_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        log.debug("NVML failed while listing GPUs (%s); no GPUs", e)
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.debug("nvmlShutdown failed: %s", e)


def _nvml_device(pynvml: ModuleType, index: int) -> Device:
    """One NVML device as a contract record (older pynvml answers bytes, newer str)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 for CUDA 12.4
    return Device(
        index=index,
        kind="cuda",
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_bytes=int(memory.total),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        compute_capability=f"{major}.{minor}",
        driver_version=_text(pynvml.nvmlSystemGetDriverVersion()),
        runtime_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
    )


def _text(value: bytes | str) -> str:
    """Older pynvml answers bytes, newer str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _rocm_devices() -> list[Device]:
    """AMD GPUs from ``rocm-smi --json`` when installed, else the amdgpu sysfs tree."""
    smi = shutil.which("rocm-smi")
    if smi is not None:
        try:
            out = subprocess.run(
                [smi, "--showproductname", "--showmeminfo", "vram", "--json"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            return parse_rocm_smi(json.loads(out))
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            log.debug("rocm-smi failed (%s); trying sysfs", e)
    return sysfs_amd_devices(Path("/sys/class/drm"))


def parse_rocm_smi(data: dict[str, dict[str, str]]) -> list[Device]:
    """Devices from ``rocm-smi --json`` output (keys ``card0``, ``card1``, ...)."""
    devices = []
    cards = sorted((k for k in data if k.startswith("card")), key=lambda k: int(k[4:] or 0))
    for index, card in enumerate(cards):
        info = data[card]
        name = info.get("Card series") or info.get("Card model") or "AMD GPU"
        total = next((v for k, v in info.items() if "VRAM Total Memory" in k), "0")
        devices.append(
            Device(
                index=index,
                kind="rocm",
                name=str(name),
                memory_bytes=int(total),
                uuid=info.get("Unique ID"),
            )
        )
    return devices


def sysfs_amd_devices(drm: Path) -> list[Device]:
    """AMD GPUs (PCI vendor 0x1002) as the amdgpu driver shows them in sysfs."""
    devices: list[Device] = []
    for card in sorted(drm.glob("card[0-9]*"), key=lambda p: p.name):
        dev = card / "device"
        try:
            if (dev / "vendor").read_text().strip() != "0x1002":
                continue
            total = int((dev / "mem_info_vram_total").read_text())
        except (OSError, ValueError):
            continue
        name = (
            f"AMD GPU {(dev / 'device').read_text().strip()}"
            if (dev / "device").exists()
            else "AMD GPU"
        )
        devices.append(Device(index=len(devices), kind="rocm", name=name, memory_bytes=total))
    return devices


_MPS_PROBE = "import torch; print(int(torch.backends.mps.is_available()))"


def _mps_devices() -> list[Device]:
    """Apple silicon's GPU through torch, asked in a subprocess (macOS only)."""
    if platform.system() != "Darwin":
        return []
    try:
        out = subprocess.run(
            [sys.executable, "-c", _MPS_PROBE], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("MPS probe failed: %s", e)
        return []
    if out != "1":
        return []
    import psutil

    return [
        Device(
            index=0,
            kind="mps",
            name=f"Apple {platform.machine()} GPU",
            memory_bytes=psutil.virtual_memory().total,
            memory_kind="unified",
        )
    ]
