"""``python -m gpulayer.worker.kernel_launcher``: the kernels a worker runs.

ipykernel's own launcher (``python -m ipykernel_launcher``) with three differences:

- The kernel takes its shell messages on its main thread, as ipyparallel's engines
  do, not through ipykernel 7's shell-channel thread (ADR 0149). That thread exists
  for kernel subshells; each message it forwards costs two thread hand-offs, about
  8% of a session kernel's CPU per cell. A kernel without it answers
  ``kernel_info`` without the ``kernel subshells`` feature, so a frontend does not
  ask for one. With an ipykernel that has no such thread (6.x) nothing changes.
- ``sys.stdout`` and ``sys.stderr`` flush at once when nothing was written since
  their last flush (:func:`_prompt_stream`, ADR 0152). ipykernel flushes both
  before each reply and again before each ``idle``, and each flush waits for a
  round trip through its I/O thread even when there is nothing to send: four
  hand-offs on every cell's path, between the code's end and the reply, and
  between the reply and the ``idle`` the worker waits for.
- With ``--worker-only`` (a kernel no frontend sees: a cell's or a session's, whose
  only client is the worker) it publishes neither a request's ``busy`` status nor
  its ``execute_input`` (:func:`_worker_only_kernel`, ADR 0153). The worker reads
  iopub to the request's ``idle`` and relays neither; each is one more message
  for the kernel's I/O thread to send and the worker to read before that ``idle``.
  A kernel relayed to a frontend (docs/kernels.md) is started without the flag
  and publishes both, as every Jupyter kernel does.
"""

import sys
from pathlib import Path
from typing import Any

#: The launcher's own argument (taken out before ipykernel reads the rest).
WORKER_ONLY = "--worker-only"


def main() -> None:
    """Start the kernel with the command line's arguments (``-f CONNECTION_FILE``)."""
    # As ipykernel_launcher does: the working folder leaves sys.path while the kernel
    # loads (IPython puts it back for the user's code).
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from ipykernel.kernelapp import IPKernelApp

    args = sys.argv[1:]
    options = [f"--IPKernelApp.outstream_class={__name__}.PromptOutStream"]
    globals()["PromptOutStream"] = _prompt_stream()
    if WORKER_ONLY in args:
        args = [a for a in args if a != WORKER_ONLY]
        globals()["WorkerOnlyKernel"] = _worker_only_kernel()
        options.append(f"--IPKernelApp.kernel_class={__name__}.WorkerOnlyKernel")

    class MainThreadShellApp(IPKernelApp):
        def init_sockets(self) -> None:
            super().init_sockets()  # type: ignore[no-untyped-call]  # ipykernel leaves it untyped
            self.shell_channel_thread = None  # ipykernel 7 then reads shell on the main loop

    # The classes are looked up by their dotted names: this module's, as run (__main__).
    MainThreadShellApp.launch_instance([*args, *options])


def _prompt_stream() -> type:
    """ipykernel's ``OutStream`` whose :meth:`flush` returns at once when nothing
    waits to be sent: no write since the last flush (from this process or a forked
    child's) and no echo. Anything written since is flushed as ipykernel does, with
    its round trip through the I/O thread, so every output still goes out before
    the reply and the ``idle`` that follow it (both are sent through that thread
    too, after it). Where ipykernel keeps that state under other names, every flush
    takes the round trip, as before."""
    from ipykernel.iostream import OutStream

    class PromptOutStream(OutStream):
        def flush(self) -> None:
            if (
                getattr(self, "_flush_pending", True) is False
                and getattr(self, "_subprocess_flush_pending", True) is False
                and getattr(self, "echo", True) is None
            ):
                return
            super().flush()  # type: ignore[no-untyped-call]  # ipykernel leaves it untyped

    return PromptOutStream


def _worker_only_kernel() -> type:
    """ipykernel's ``IPythonKernel`` that publishes no ``busy`` status for a shell
    request and no ``execute_input``; ``idle``, outputs, errors and replies are as
    ever. (Both names are ipykernel's own hooks, in 6.x and 7.x alike; where a
    release renamed them, the kernel publishes both again.)"""
    from ipykernel.ipkernel import IPythonKernel

    class WorkerOnlyKernel(IPythonKernel):
        def _publish_execute_input(self, code: Any, parent: Any, execution_count: Any) -> None:
            return None

        def _publish_status(self, status: Any, channel: Any, parent: Any = None) -> None:
            if status == "busy" and channel == "shell":
                return
            super()._publish_status(status, channel, parent)  # type: ignore[no-untyped-call]  # ipykernel leaves it untyped

    return WorkerOnlyKernel


if __name__ == "__main__":
    main()
