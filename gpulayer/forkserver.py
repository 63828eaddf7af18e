"""The fork server ``gpulayer up`` forks its first workers from (ADR 0151): ``python
-m gpulayer.forkserver FD`` imports what ``gpulayer join`` runs once, then forks a
worker for each request on the socket ``FD``. The caller's side, and the wire, are
in :mod:`gpulayer.cli.forks`.

This module imports nothing of gpulayer's at its top: :func:`_warm` first does what
``python -m gpulayer`` does before its imports (ADR 0147, ADR 0148).
"""

import contextlib
import functools
import importlib
import json
import os
import selectors
import socket
import sys
import threading
import traceback
from typing import Any

#: The largest message read (as gpulayer.cli.forks.MAX_MESSAGE).
_MAX_MESSAGE = 1 << 16
#: What a worker imports only once it runs (httpx's transport, anyio's backend, the
#: GPU library, ...): imported ahead too, each where installed.
_LAZY = (
    "httpcore", "h11", "anyio", "anyio._backends._asyncio", "anyio.to_thread",
    "anyio.lowlevel", "sniffio", "certifi", "pynvml", "uv", "stringprep", "ctypes.util",
)  # fmt: skip


def _warm() -> Any:
    """Import what ``gpulayer join`` runs, as ``python -m gpulayer`` does; the CLI's
    entry point."""
    from gpulayer.startup import hold_gc, skip_pydantic_plugins

    hold_gc()  # each worker releases it once registered (ADR 0147)
    skip_pydantic_plugins()  # ADR 0148
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # as gpulayer/__main__.py
    from gpulayer.cli import build_parser, main
    from gpulayer.worker import agent  # noqa: F401  (the worker itself, imported by `join` lazily)

    for name in _LAZY:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    parser = build_parser()  # each worker parses its own command line with it
    return functools.partial(main, parser=parser)


def _child(main: Any, preexec: Any, request: dict[str, Any], fds: list[int], keep: set[int]) -> int:
    """In the forked child: become ``gpulayer <args>`` and run it."""
    from gpulayer.worker.spawning import name_process  # imported already (by _warm)

    os.setsid()  # its own session, as spawn() gives a worker (a Ctrl-C reaches only `up`)
    if preexec is not None:
        preexec()
    stdin, out = fds
    os.dup2(stdin, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    for fd in {stdin, out, *keep}:
        if fd > 2:
            os.close(fd)
    args = list(request["args"])
    name = args[args.index("--name") + 1] if "--name" in args else "worker"
    name_process(f"gl-{name}")
    os.chdir(request["cwd"])
    sys.argv = ["gpulayer", *args]
    return int(main(args))


def serve(fd: int) -> int:
    """The fork server's loop on socket ``fd``: fork a worker per request, send each
    exit status back, exit once the socket is closed and no worker is left."""
    main = _warm()
    if threading.active_count() != 1:  # a fork copies no thread but this one: refuse
        print("gpulayer fork server: an import started a thread; not forking", file=sys.stderr)
        return 3
    from gpulayer.worker.spawning import die_with_parent

    preexec = die_with_parent()  # each worker dies with this server, which dies with `up`
    sock = socket.socket(fileno=fd)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    children: dict[int, int] = {}  # pid -> the pidfd this server watches
    open_ = True
    while open_ or children:
        for key, _ in sel.select():
            if key.data is not None:  # a worker exited
                pid = int(key.data)
                _, status = os.waitpid(pid, 0)
                sel.unregister(key.fileobj)
                os.close(children.pop(pid))
                with contextlib.suppress(OSError):  # the caller is gone
                    sock.send(
                        json.dumps(
                            {"exited": pid, "code": os.waitstatus_to_exitcode(status)}
                        ).encode()
                    )
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 2)
            except OSError:
                data, fds = b"", []
            if not data:
                sel.unregister(sock)
                open_ = False
                continue
            try:
                request = json.loads(data)
                if len(fds) != 2:
                    raise ValueError(f"a request carries 2 file descriptors, not {len(fds)}")
                keep = {sock.fileno(), *children.values(), sel.fileno()}
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the forked worker (its own tests see it)
                    code = 1
                    try:
                        code = _child(main, preexec, request, fds, keep)
                    except SystemExit as e:
                        code = e.code if isinstance(e.code, int) else 1
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        with contextlib.suppress(Exception):
                            sys.stdout.flush()
                            sys.stderr.flush()
                    os._exit(code)
                watch = os.pidfd_open(pid)
                theirs = os.pidfd_open(pid)
                children[pid] = watch
                sel.register(watch, selectors.EVENT_READ, pid)
                try:
                    socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [theirs])
                finally:
                    os.close(theirs)
            except Exception as e:  # a bad request or a failed fork: say so, keep serving
                with contextlib.suppress(OSError):
                    sock.send(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            finally:
                for f in fds:
                    os.close(f)
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
