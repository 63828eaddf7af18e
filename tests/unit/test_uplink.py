"""The worker's uplink against canned answers (httpx.MockTransport): it waits out 429
and 503 answers as their ``Retry-After`` asks and carries on, never giving up."""

import asyncio
import time
from pathlib import Path

import httpx

from gpulayer import contracts
from gpulayer.worker.uplink import RETRY_AFTER_CAP_SECONDS, Uplink, retry_after

URL = "http://cp.example:8888/"


def uplink(handler, tmp_path: Path) -> tuple[Uplink, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))

    def registration() -> contracts.WorkerRegistration:
        return contracts.WorkerRegistration(
            name="w", hostname="h", cpus=1, memory_bytes=1, version="t"
        )

    link = Uplink(
        http,
        URL,
        "gl_join",
        name="w",
        registration=registration,
        on_registered=lambda reg: None,
        blob_dir=tmp_path,
    )
    return link, http


def test_429_and_503_are_waited_out_as_retry_after_asks(tmp_path):
    answers = [
        httpx.Response(429, headers={"Retry-After": "1"}, json={"code": "rate_limited"}),
        httpx.Response(503, headers={"Retry-After": "0"}),
        httpx.Response(200, json={"kill_tasks": [], "cancel": []}),
    ]
    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        return answers.pop(0)

    async def go() -> httpx.Response:
        link, http = uplink(handler, tmp_path)
        async with http:
            return await link.call("POST", "heartbeat", worker_route=True)

    resp = asyncio.run(go())
    assert resp.status_code == 200 and not answers
    assert seen[1] - seen[0] >= 1.0  # the Retry-After of the 429 was honoured


def test_retry_after_reads_seconds_and_dates_and_caps_them():
    def ask(value: str) -> float:
        return retry_after(httpx.Response(429, headers={"Retry-After": value}))

    assert ask("7") == 7.0
    assert ask("100000") == RETRY_AFTER_CAP_SECONDS
    assert ask("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert ask("soon") == 0.0
    assert retry_after(httpx.Response(429)) == 0.0
