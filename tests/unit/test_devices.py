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
    with pytest.raises(ValueError, match=r"\[COUNTx\]MODEL-MEMORYGB.*'2xA100-80GB") as info:
        parse_simulated(value)
    assert SIMULATED_GPUS_ENV in str(info.value)


def test_discover_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIMULATED_GPUS_ENV, "3xA10-24GB")
    assert [d.index for d in discover()] == [0, 1, 2]
    monkeypatch.setenv(SIMULATED_GPUS_ENV, "lots of GPUs")
    with pytest.raises(ValueError, match=SIMULATED_GPUS_ENV):
        discover()


def test_discover_without_simulation_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIMULATED_GPUS_ENV, raising=False)
    found = discover()  # NVML fails here (no driver): that is "no GPUs", not an error
    if found:
        pytest.skip(f"NVML found {len(found)} real GPU(s)")
    assert found == []
