"""``python -m gpulayer.worker.kernel_launcher``: the kernels a worker runs.

ipykernel's own launcher (``python -m ipykernel_launcher``) with two differences:

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
"""

import sys
from pathlib import Path


def main() -> None:
    """Start the kernel with the command line's arguments (``-f CONNECTION_FILE``)."""
    # As ipykernel_launcher does: the working folder leaves sys.path while the kernel
    # loads (IPython puts it back for the user's code).
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    from ipykernel.kernelapp import IPKernelApp

    globals()["PromptOutStream"] = _prompt_stream()

    class MainThreadShellApp(IPKernelApp):
        def init_sockets(self) -> None:
            super().init_sockets()  # type: ignore[no-untyped-call]  # ipykernel leaves it untyped
            self.shell_channel_thread = None  # ipykernel 7 then reads shell on the main loop

    # The class is looked up by its dotted name: this module's, as run (__main__).
    MainThreadShellApp.launch_instance(
        [*sys.argv[1:], f"--IPKernelApp.outstream_class={__name__}.PromptOutStream"]
    )


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


if __name__ == "__main__":
    main()
