"""Every requirement and every reason of placement, on parsed worker views (pure, fast)."""

import pytest

from gpulayer.contracts import Device, Resources, WorkerState
from jupyter_ext.placement import Usage, WorkerView, describe_gpus, fit, static_misfit

GIB = 1024**3


def gpu(i, name="NVIDIA A100-SXM4-80GB", mem=80, kind="cuda", cc="8.0", memory_kind="dedicated"):
    return Device(
        index=i,
        kind=kind,
        name=name,
        memory_bytes=mem * GIB,
        compute_capability=cc,
        memory_kind=memory_kind,
    )


def worker(name="box", state="ready", devices=(), cpus=8, memory=64, slots=4, labels=None):
    return WorkerView(
        id=name,
        name=name,
        state=WorkerState(state),
        cpus=cpus,
        memory_bytes=memory * GIB,
        slots=slots,
        labels=labels or {},
        devices=tuple(devices),
    )


A100x2 = worker(devices=[gpu(0), gpu(1)])
MIXED = worker(
    devices=[gpu(0, "NVIDIA T4", 16, cc="7.5"), gpu(1, "NVIDIA H100 80GB HBM3", 80, cc="9.0")]
)


def R(**kw):
    return Resources(**kw)


@pytest.mark.parametrize(("res", "w", "expect"), [
    (R(), A100x2, []),
    (R(gpus=1), A100x2, [0]),
    (R(gpus=2), A100x2, [0, 1]),
    (R(gpus=3), A100x2, "needs 3 × GPU, has 2"),
    (R(gpus=1), worker(), "needs 1 × GPU, has no GPUs"),
    (R(gpus=1, gpu_memory="40GiB"), MIXED, [1]),
    (R(gpus=2, gpu_memory="40GiB"), MIXED, "needs 2 × GPU ≥ 40 GiB, only 1 of its 2 GPUs match"),
    (R(gpus=1, gpu_model="T4|V100"), MIXED, [0]),
    (R(gpus=1, gpu_model="a100"), MIXED, "needs 1 × /a100/ GPU, only 0 of its 2 GPUs match"),
    (R(gpus=1, min_compute_capability="8.0"), MIXED, [1]),
    (R(gpus=1, min_compute_capability="9.5"), MIXED,
     "needs 1 × GPU cc ≥ 9.5, only 0 of its 2 GPUs match"),
    (R(gpus=1, accelerator="rocm"), MIXED, "needs 1 × rocm GPU, only 0 of its 2 GPUs match"),
    (R(gpus=1, accelerator="rocm"), worker(devices=[gpu(0, "MI250", 64, kind="rocm", cc=None)]),
     [0]),
    (R(gpus=1, gpu_memory_kind="unified"), MIXED,
     "needs 1 × GPU (unified memory), only 0 of its 2 GPUs match"),
    (R(profile="pytorch-mps"), worker(devices=[gpu(0, "Apple M3", 36, kind="mps", cc=None,
                                                   memory_kind="unified")]), [0]),
    (R(cpus=16), A100x2, "needs 16 CPUs, has 8"),
    (R(memory="128GiB"), A100x2, "needs 128.0 GiB memory, has 64.0 GiB"),
    (R(worker="other"), A100x2, "not the requested worker 'other'"),
    (R(worker="box"), A100x2, []),
    (R(selector={"zone": "eu"}), A100x2, "has no label zone (wanted zone=eu)"),
    (R(selector={"zone": "eu"}), worker(labels={"zone": "us"}),
     "label zone=eu wanted, has zone=us"),
    (R(selector={"zone": "eu"}), worker(labels={"zone": "eu"}), []),
    (R(), worker(state="draining"), "draining: takes no new tasks"),
    (R(), worker(state="offline"), "offline"),
    (R(), worker(state="unhealthy"), "unhealthy"),
])  # fmt: skip
def test_fit_on_an_idle_worker(res, w, expect):
    assert fit(res, w, Usage()) == expect


def test_busy_gpus_and_slots_name_the_jobs_holding_them():
    busy = Usage(tasks=1, gpus={0: "7f3a9c2d1e00"})
    assert fit(R(gpus=1), A100x2, busy) == [1]
    assert fit(R(gpus=2), A100x2, busy) == "needs 2 × GPU, has 1 free (GPU 0 busy with job 7f3a9c)"
    assert fit(R(), A100x2, Usage(tasks=4)) == "all 4 task slots busy"
    assert fit(R(), worker(slots=1), Usage(tasks=1)) == "its only task slot is busy"


def test_static_misfit_ignores_what_is_busy_now():
    assert static_misfit(R(gpus=2), A100x2) is None
    assert static_misfit(R(gpus=3), A100x2) == "needs 3 × GPU, has 2"


def test_describe_gpus_reads_like_the_request():
    res = R(gpus=2, accelerator="cuda", gpu_memory="40GiB", min_compute_capability="8.0")
    assert describe_gpus(res) == "2 × cuda GPU ≥ 40 GiB cc ≥ 8.0"


@pytest.mark.parametrize(("bad", "message"), [
    ({"gpu_memory": "40GiB"}, "gpu_memory needs gpus >= 1"),
    ({"accelerator": "cpu", "gpus": 1}, "accelerator 'cpu' contradicts gpus > 0"),
    ({"gpus": 1, "accelerator": "rocm", "min_compute_capability": "8.0"}, "cuda GPUs only"),
    ({"gpus": 1, "gpu_model": "(("}, "not a supported regular expression"),
    ({"gpus": 1, "min_compute_capability": "eight"}, "not a compute capability"),
    ({"profile": "tensorflow"}, "unknown profile 'tensorflow'"),
    ({"gpus": 1, "accelerator": "mps", "gpu_memory_kind": "dedicated"}, "unified memory"),
])  # fmt: skip
def test_contradictory_or_unknown_requirements_are_refused(bad, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        Resources(**bad)


def test_a_profile_is_a_shorthand_that_explicit_fields_override():
    assert R(profile="pytorch-cuda").gpus == 1
    assert R(profile="pytorch-cuda").accelerator == "cuda"
    assert R(profile="pytorch-cuda", gpus=4).gpus == 4
