"""``python -m gpulayer.worker.kernel_launcher``: the kernels a worker runs.

ipykernel's own launcher (``python -m ipykernel_launcher``) with one difference:
the kernel takes its shell messages on its main thread, as ipyparallel's engines
do, not through ipykernel 7's shell-channel thread (ADR 0149). That thread exists
for kernel subshells; each message it forwards costs two thread hand-offs, about
8% of a session kernel's CPU per cell. A kernel without it answers
``kernel_info`` without the ``kernel subshells`` feature, so a frontend does not
ask for one. With an ipykernel that has no such thread (6.x) nothing changes.
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

    class MainThreadShellApp(IPKernelApp):
        def init_sockets(self) -> None:
            super().init_sockets()  # type: ignore[no-untyped-call]  # ipykernel leaves it untyped
            self.shell_channel_thread = None  # ipykernel 7 then reads shell on the main loop

    MainThreadShellApp.launch_instance()


if __name__ == "__main__":
    main()
