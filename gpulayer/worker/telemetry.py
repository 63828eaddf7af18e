"""Readings for heartbeats: each GPU (:class:`GpuTelemetry`) and each running
task's process tree (:class:`TreeSampler`)."""

import logging
from types import ModuleType

import psutil

from gpulayer.contracts import Device, GpuSample, TaskSample

log = logging.getLogger(__name__)


class GpuTelemetry:
    """Per-GPU readings for heartbeats; one NVML session for the agent's lifetime.

    Simulated GPUs and GPUs NVML cannot read report their index only.
    """

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self._nvml: ModuleType | None = None
        if not any(d.kind == "cuda" and not d.simulated for d in devices):
            return
        try:
            import pynvml
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            log.debug("no NVML telemetry: %s", e)
            return
        self._nvml = pynvml

    def sample(self) -> list[GpuSample]:
        """One reading per device."""
        out = []
        for d in self.devices:
            if self._nvml is None or d.simulated or d.kind != "cuda":
                out.append(GpuSample(index=d.index))
                continue
            out.append(self._nvml_sample(d.index))
        return out

    def _nvml_sample(self, index: int) -> GpuSample:
        nv = self._nvml
        assert nv is not None
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except nv.NVMLError as e:
            log.debug("NVML reading of GPU %d failed: %s", index, e)
            return GpuSample(index=index)
        return GpuSample(
            index=index,
            utilization_percent=float(util.gpu),
            memory_used_bytes=int(mem.used),
            temperature_c=float(temp),
            power_w=power,
        )

    def close(self) -> None:
        """End the NVML session."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                log.debug("nvmlShutdown failed: %s", e)
            self._nvml = None


class TreeSampler:
    """CPU and memory of each running task's process tree, for heartbeats.

    psutil's ``cpu_percent`` measures since the previous call on the same
    ``Process`` object, so the sampler keeps them between heartbeats.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def sample(self, task_id: str, pid: int | None) -> TaskSample:
        """One reading of the tree rooted at ``pid`` (zeros once it is gone)."""
        if pid is None:
            return TaskSample(task_id=task_id)
        try:
            root = self._procs.setdefault(pid, psutil.Process(pid))
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            self._procs.pop(pid, None)
            return TaskSample(task_id=task_id)
        cpu, rss, alive = 0.0, 0, 0
        for p in tree:
            p = self._procs.setdefault(p.pid, p)
            try:
                cpu += p.cpu_percent(None)
                rss += p.memory_info().rss
                alive += 1
            except psutil.Error:
                self._procs.pop(p.pid, None)
        return TaskSample(task_id=task_id, cpu_percent=cpu, rss_bytes=rss, processes=alive)

    def forget(self, pids: set[int]) -> None:
        """Drop cached processes that are not in ``pids`` any more."""
        for pid in list(self._procs):
            if pid not in pids and not self._procs[pid].is_running():
                del self._procs[pid]
