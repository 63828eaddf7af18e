"""Limits on what clients and workers send, through a real Jupyter server with the
extension: refused with a 4xx naming the field, nothing stored, no 500."""

from .test_worker_handlers import join

EVIL_PATTERN = "(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)(.*)X"


def job(**resources):
    return {"command": ["true"], "resources": {"gpus": 1, **resources}}


async def test_a_gpu_model_the_linear_engine_cannot_compile_is_400_naming_it(gl_api):
    for pattern in [r"(a)\1", "(?=A100)", "x{1001}", "(", "A" * 201]:
        status, err = await gl_api("jobs", method="POST", json_body=job(gpu_model=pattern))
        assert status == 400, (pattern, err)
        assert err["field"] == "resources.gpu_model", err
    status, batch = await gl_api(
        "jobs", "batch", method="POST", json_body={"jobs": [job(), job(gpu_model="(?<=x)")]}
    )
    assert status == 400 and batch["field"].endswith("resources.gpu_model"), batch
    status, page = await gl_api("jobs")
    assert page["jobs"] == []


async def test_a_catastrophic_pattern_is_matched_at_once(gl_api):
    """The backtracking pattern of issue 15 against a long GPU name: placement and
    every read of the job answer at once; the job waits with a reason."""
    name = "NVIDIA GeForce RTN 4090 Laptop GPU, one long name without the letter"
    dev = {"index": 0, "kind": "cuda", "name": name, "memory_bytes": 16 << 30}
    await join(gl_api, devices=[dev])
    status, queued = await gl_api("jobs", method="POST", json_body=job(gpu_model=EVIL_PATTERN))
    assert status == 201 and queued["state"] == "queued"
    assert "only 0 of its 1 GPU match" in queued["pending_reasons"][0], queued
    status, placement = await gl_api("jobs", queued["id"], "placement")
    assert status == 200 and not placement["workers"][0]["fits"], placement
    status, ok = await gl_api("jobs", method="POST", json_body=job(gpu_model="rtn.*4090"))
    assert status == 201 and ok["state"] == "scheduled", ok


async def test_selectors_are_capped(gl_api):
    selector = {f"k{i}": "v" for i in range(33)}
    status, err = await gl_api("jobs", method="POST", json_body=job(selector=selector))
    assert status == 400 and err["field"] == "resources.selector", err
