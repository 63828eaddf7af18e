"""Device discovery: simulated inventories and the GPU-less fallback."""

import pytest

from gpulayer.worker.devices import SIMULATED_GPUS_ENV, discover, parse_simulated

GIB = 1024**3


def test_simulated_inventory_counts_names_memory_and_indices() -> None:
    found = parse_simulated("2xA100-80GB, 1xH100-80GB")
    assert [(d.index, d.name, d.memory_bytes, d.uuid) for d in found] == [
        (0, "NVIDIA A100 (simulated)", 80 * GIB, "GPU-sim-0"),
        (1, "NVIDIA A100 (simulated)", 80 * GIB, "GPU-sim-1"),
        (2, "NVIDIA H100 (simulated)", 80 * GIB, "GPU-sim-2"),
    ]
    assert all(d.kind == "cuda" and d.simulated for d in found)


@pytest.mark.parametrize(
    ("value", "name", "memory_bytes"),
    [
        ("1xT4-16GB", "NVIDIA T4 (simulated)", 16 * GIB),
        ("T4-16GB", "NVIDIA T4 (simulated)", 16 * GIB),
        ("RTX-4090-24GB", "NVIDIA RTX-4090 (simulated)", 24 * GIB),
        ("1xL4-22.5GB", "NVIDIA L4 (simulated)", int(22.5 * GIB)),
    ],
)
def test_one_simulated_gpu(value: str, name: str, memory_bytes: int) -> None:
    (device,) = parse_simulated(value)
    assert (device.index, device.name, device.memory_bytes) == (0, name, memory_bytes)


def test_an_empty_value_simulates_no_gpus() -> None:
    assert parse_simulated("") == []


@pytest.mark.parametrize("value", ["A100", "2xA100", "A100-80", "0xA100-80GB", "2xA100-80GB,"])
def test_a_malformed_value_names_the_accepted_form(value: str) -> None:
    with pytest.raises(
        ValueError, match=r"\[COUNTx\]\[KIND:\]MODEL-MEMORYGB.*'2xA100-80GB"
    ) as info:
        parse_simulated(value)
    assert SIMULATED_GPUS_ENV in str(info.value)


def test_discover_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIMULATED_GPUS_ENV, "3xA10-24GB")
    assert [d.index for d in discover()] == [0, 1, 2]
    monkeypatch.setenv(SIMULATED_GPUS_ENV, "lots of GPUs")
    with pytest.raises(ValueError, match=SIMULATED_GPUS_ENV):
        discover()


def test_in_a_slurm_allocation_only_the_gpus_slurm_gave_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SIMULATED_GPUS_ENV, "4xA100-80GB")  # the node's GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert len(discover()) == 4  # outside Slurm, CUDA_VISIBLE_DEVICES is the user's business
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    assert [d.index for d in discover()] == [1, 3]  # NVML lists all four; Slurm gave two
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-sim-2")
    assert [d.index for d in discover()] == [2]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert len(discover()) == 4  # Slurm named none (a whole-node allocation): all


def test_discover_without_simulation_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIMULATED_GPUS_ENV, raising=False)
    found = discover()  # NVML fails here (no driver): that is "no GPUs", not an error
    if found:
        pytest.skip(f"NVML found {len(found)} real GPU(s)")
    assert found == []


def test_simulated_kinds_and_compute_capabilities():
    devs = parse_simulated("1xH100-80GB,1xT4-16GB,2xrocm:MI250-64GB,1xmps:M3-36GB")
    assert [(d.index, d.kind) for d in devs] == [
        (0, "cuda"),
        (1, "cuda"),
        (2, "rocm"),
        (3, "rocm"),
        (4, "mps"),
    ]
    assert [d.compute_capability for d in devs] == ["9.0", "7.5", None, None, None]
    assert devs[4].memory_kind == "unified" and devs[0].memory_kind == "dedicated"
    assert devs[2].name == "AMD MI250 (simulated)"


def test_amd_gpus_are_read_from_a_sysfs_tree(tmp_path):
    from gpulayer.worker.devices import sysfs_amd_devices

    for card, vendor, vram in (
        ("card0", "0x1002", 64 << 30),
        ("card1", "0x8086", 0),
        ("card2", "0x1002", 32 << 30),
    ):
        dev = tmp_path / card / "device"
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "device").write_text("0x740c\n")
        (dev / "mem_info_vram_total").write_text(str(vram))
    devs = sysfs_amd_devices(tmp_path)
    assert [(d.index, d.kind, d.memory_bytes) for d in devs] == [
        (0, "rocm", 64 << 30),
        (1, "rocm", 32 << 30),
    ]


def test_rocm_smi_json_is_parsed():
    from gpulayer.worker.devices import parse_rocm_smi

    out = {
        "card1": {"Card series": "Instinct MI210", "VRAM Total Memory (B)": "68702699520"},
        "card0": {
            "Card series": "Instinct MI250X",
            "VRAM Total Memory (B)": "68702699520",
            "Unique ID": "0x1234",
        },
        "system": {"Driver version": "6.7"},
    }
    devs = parse_rocm_smi(out)
    assert [(d.index, d.name, d.uuid) for d in devs] == [
        (0, "Instinct MI250X", "0x1234"),
        (1, "Instinct MI210", None),
    ]


def test_telemetry_of_simulated_gpus_reports_each_index():
    from gpulayer.worker.telemetry import GpuTelemetry

    t = GpuTelemetry(parse_simulated("2xA100-80GB"))
    assert [s.index for s in t.sample()] == [0, 1]
    assert t.sample()[0].utilization_percent is None
    t.close()


@pytest.mark.gpu
def test_nvml_reports_real_gpus_with_capabilities():
    import os

    if os.environ.get("GPULAYER_RUN_GPU_TESTS") != "1":
        pytest.skip("set GPULAYER_RUN_GPU_TESTS=1 on a machine with an NVIDIA GPU")
    from gpulayer.worker.devices import nvml_devices
    from gpulayer.worker.telemetry import GpuTelemetry

    devs = nvml_devices()
    if not devs:
        pytest.skip("NVML finds no GPU here")
    assert all(d.kind == "cuda" and d.memory_bytes > 0 and d.compute_capability for d in devs)
    assert devs[0].driver_version and devs[0].runtime_version
    samples = GpuTelemetry(devs).sample()
    assert samples[0].memory_used_bytes is not None
