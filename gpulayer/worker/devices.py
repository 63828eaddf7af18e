"""Device discovery: the one seam between the worker and its GPUs.

:func:`discover` lists the worker's accelerators as :class:`~gpulayer.contracts.Device`
records. Real GPUs come from NVML (``pynvml``, imported only when discovery runs, so
``import gpulayer`` stays light). Tests and laptops simulate GPUs with the environment
variable ``GPULAYER_SIMULATED_GPUS``::

    GPULAYER_SIMULATED_GPUS="2xA100-80GB,1xH100-80GB"   # three GPUs, indices 0..2
    GPULAYER_SIMULATED_GPUS="T4-16GB"                   # the count prefix is optional
    GPULAYER_SIMULATED_GPUS=""                          # no GPUs, even on a GPU machine

The CPU is not a device: the registration describes it with ``cpus`` and
``memory_bytes``.
"""

import logging
import os
import re
from types import ModuleType

from gpulayer.contracts import Device

log = logging.getLogger(__name__)

SIMULATED_GPUS_ENV = "GPULAYER_SIMULATED_GPUS"

_GIB = 1024**3
_ITEM = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<model>.+?)-(?P<memory>\d+(?:\.\d+)?)\s*GB$")
_MODEL = re.compile(r"^[A-Za-z0-9][\w.\- ]*$")
_ACCEPTED = (
    "use a comma-separated list of [COUNTx]MODEL-MEMORYGB,"
    " e.g. '2xA100-80GB,1xH100-80GB' or 'T4-16GB'"
)


def discover() -> list[Device]:
    """The GPUs of this machine: simulated ones when ``GPULAYER_SIMULATED_GPUS`` is set,
    else whatever NVML reports, else none.

    Raises
    ------
    ValueError
        If ``GPULAYER_SIMULATED_GPUS`` is set but malformed; the message shows the
        accepted form.
    """
    simulated = os.environ.get(SIMULATED_GPUS_ENV)
    if simulated is not None:
        return parse_simulated(simulated)
    return _nvml_devices()


def parse_simulated(value: str) -> list[Device]:
    """Simulated devices from a ``GPULAYER_SIMULATED_GPUS`` value such as ``"2xA100-80GB"``.

    Raises
    ------
    ValueError
        If an item is not ``[COUNTx]MODEL-MEMORYGB``.
    """
    devices: list[Device] = []
    if not value.strip():
        return devices
    for item in value.split(","):
        count, model, memory_bytes = _parse_item(item.strip(), value)
        for _ in range(count):
            index = len(devices)
            devices.append(
                Device(
                    index=index,
                    kind="cuda",
                    name=f"NVIDIA {model} (simulated)",
                    memory_bytes=memory_bytes,
                    uuid=f"GPU-sim-{index}",
                    simulated=True,
                )
            )
    return devices


def _parse_item(item: str, value: str) -> tuple[int, str, int]:
    """``(count, model, memory_bytes)`` of one item, or a ValueError naming it."""
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
    return count, model, memory_bytes


def _nvml_devices() -> list[Device]:
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
    name = pynvml.nvmlDeviceGetName(handle)
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return Device(
        index=index,
        kind="cuda",
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_bytes=int(memory.total),
        uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
    )
