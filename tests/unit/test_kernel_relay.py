"""Both ends of the kernel relay back to back around a real local ipykernel
(gpulayer/kernel_relay.py): a Jupyter client talks to the proxy's ports with the
proxy's own key, the kernel end signs again with the kernel's; no control plane."""

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager

from gpulayer.kernel_relay import Frame, KernelEnd, ProxyEnd, pack, unpack

pytestmark = pytest.mark.timeout(90)


def test_a_frame_travels_whole_and_a_bad_one_is_named() -> None:
    frame = Frame("stdin", [b"client-1"], [b"{}", b"{}", b"{}", b'{"a": 1}', b"\x00buf"])
    assert unpack(pack(frame)) == frame
    with pytest.raises(ValueError, match="relay frame"):
        unpack(pack(frame)[:-1])
    with pytest.raises(ValueError, match="relay frame"):
        unpack(b"GET / HTTP/1.1")


@asynccontextmanager
async def _relayed() -> AsyncIterator[tuple[AsyncKernelClient, KernelEnd, list[str]]]:
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel(env={**os.environ, "GL_WHERE": "behind the relay"})
    states: list[str] = []
    proxy: ProxyEnd

    async def to_proxy(data: bytes) -> None:
        await proxy.feed(data)

    kernel_end = KernelEnd(km.get_connection_info(), to_proxy, on_state=states.append)
    proxy = ProxyEnd(b"the-proxy-key", kernel_end.feed)
    await kernel_end.start()
    ports = await proxy.bind()
    kc = AsyncKernelClient()
    kc.load_connection_info({"transport": "tcp", "ip": "127.0.0.1", "key": b"the-proxy-key",
                             "signature_scheme": "hmac-sha256", **ports})  # fmt: skip
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=30)
        yield kc, kernel_end, states
    finally:
        kc.stop_channels()
        await proxy.close()
        await kernel_end.close()
        await km.shutdown_kernel(now=True)


async def _run(
    kc: AsyncKernelClient,
    code: str,
    on_stdin: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Execute ``code``; its reply and iopub messages (until idle)."""
    msg_id = kc.execute(code, allow_stdin=on_stdin is not None)
    if on_stdin is not None:
        await on_stdin(await kc.get_stdin_msg(timeout=20))
    seen = []
    while True:
        msg = await kc.get_iopub_msg(timeout=20)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # an earlier request's late reply (wait_for_ready asks more than once)
        reply = await kc.get_shell_msg(timeout=20)
        if reply["parent_header"]["msg_id"] == msg_id:
            return reply, seen


def _stdout(seen: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in seen if m["msg_type"] == "stream")


def test_execute_input_and_a_widgets_comm_cross_the_relay() -> None:
    async def main() -> None:
        async with _relayed() as (kc, kernel_end, states):
            reply, seen = await _run(kc, "import os; print(os.environ['GL_WHERE'])")
            assert reply["content"]["status"] == "ok"
            assert _stdout(seen) == "behind the relay\n"
            assert states[:2] == ["busy", "idle"]  # the worker tells the plane

            async def answer(msg: dict[str, Any]) -> None:
                assert msg["content"]["prompt"] == "name? "
                kc.input("ada")

            reply, seen = await _run(kc, "x = input('name? '); print('hi', x)", answer)
            assert reply["content"]["status"] == "ok"
            assert "hi ada" in _stdout(seen)

            # A widget made in the kernel opens a comm; an update from the client
            # changes the kernel's value.
            _, seen = await _run(kc, "import ipywidgets as w; s = w.IntSlider(3); s")
            models = {m["content"]["data"]["state"].get("_model_name"): m["content"]["comm_id"]
                      for m in seen if m["msg_type"] == "comm_open"}  # fmt: skip
            assert "IntSliderModel" in models, [m["msg_type"] for m in seen]
            comm_id = models["IntSliderModel"]
            update = {"method": "update", "state": {"value": 7}, "buffer_paths": []}
            kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": update}))
            _, seen = await _run(kc, "print(s.value)")
            assert _stdout(seen) == "7\n"

            reply, _ = await _run(kc, "1/0")
            assert reply["content"]["ename"] == "ZeroDivisionError"
            assert kernel_end.dropped == 0

    asyncio.run(main())


def test_the_proxy_drops_a_message_signed_with_another_key() -> None:
    async def main() -> None:
        async with _relayed() as (kc, _, _):
            forged = AsyncKernelClient()
            forged.load_connection_info({**kc.get_connection_info(), "key": b"wrong"})
            forged.start_channels()
            try:
                forged.execute("print('forged')")
                with pytest.raises(Exception):  # noqa: B017 (queue.Empty: nothing ran)
                    await forged.get_shell_msg(timeout=2)
            finally:
                forged.stop_channels()
            reply, _ = await _run(kc, "a = 1")  # the relay still serves the real client
            assert reply["content"]["status"] == "ok"

    asyncio.run(main())
