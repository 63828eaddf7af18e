"""The ``gpulayer`` parser and :func:`main`: parse, run the command, map errors to one line."""

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from pydantic import ValidationError as PydanticValidationError

from gpulayer import __version__, errors
from gpulayer.cli import (
    jobs,
    kernels,
    logs,
    output,
    providers,
    secrets,
    sessions,
    status,
    tokens,
    up,
    workers,
)
from gpulayer.cli.options import Parser, connection_options, examples
from gpulayer.client import Connection
from gpulayer.client.specs import pydantic_to_gpulayer
from gpulayer.startup import release_gc

_DESCRIPTION = """\
gpulayer: run commands, functions, notebook cells and PyTorch training on GPU
workers. `gpulayer up` starts a control plane and a worker on this machine;
`gpulayer join URL` adds a worker on another one.

The connection comes from --url and --token, else GPULAYER_URL and
GPULAYER_TOKEN, else the file `gpulayer up` saved."""

#: The exit codes of every command (printed by ``gpulayer --help``; docs/user-guide.md).
EXIT_CODES: dict[str, str] = {
    "0": "success (status: the control plane is up)",
    "1": "an error, printed as one line (status: it is not reachable; down: nothing to stop)",
    "2": "bad usage or a malformed option",
    "N": "submit -f and logs -f: the job's own exit code (128+S when killed by signal S)",
    "130": "interrupted (Ctrl-C)",
}

_EPILOG = (
    examples(
        "gpulayer up --simulated-gpus 2xA100-80GB   # a local cluster to try things on",
        "gpulayer submit --gpus 1 -f -- python -c 'print(1)'",
        "gpulayer jobs -o json | jq '.jobs[0].state'",
        "gpulayer status && gpulayer down",
        'eval "$(gpulayer completion bash)"           # tab completion',
    )
    + "\n\nexit codes:\n"
    + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES.items())
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpulayer`` command."""
    conn = connection_options()
    parser = Parser(prog="gpulayer", parents=[conn], description=_DESCRIPTION, epilog=_EPILOG)
    parser.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for group in (up, status, jobs, logs, workers, sessions, kernels, tokens, secrets, providers):
        group.add_parsers(sub, conn)
    completion = sub.add_parser(
        "completion",
        help="print the shell code of tab completion",
        epilog=examples(
            'eval "$(gpulayer completion bash)"   # in ~/.bashrc',
            'eval "$(gpulayer completion zsh)"    # in ~/.zshrc',
        ),
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="your shell")
    completion.set_defaults(func=_completion)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    connection: Connection | None = None,
    parser: argparse.ArgumentParser | None = None,
) -> int:
    """Run the ``gpulayer`` command; returns the exit code.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).
    connection
        Use this connection instead of resolving ``--url``/``--token`` (for
        embedding and tests).
    parser
        The parser :func:`build_parser` made (default: a new one): the fork server
        builds it once for the workers it forks.
    """
    try:
        parser = parser or build_parser()
        if argv is None:
            _complete(parser)  # answers a shell's completion request and exits
        args = _parse(parser, argv)
        if args.cmd != "join":  # a worker releases it once registered (worker.agent)
            release_gc()
        args.connection = connection
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:
        return _reader_left()
    except errors.GpulayerError as e:
        return output.fail(e.message, 2 if isinstance(e, errors.ValidationError) else 1)
    except PydanticValidationError as e:  # a model a command built from its flags
        return output.fail(pydantic_to_gpulayer(e).message, 2)
    except (OSError, TimeoutError) as e:
        return output.fail(str(e) or type(e).__name__, 1)


def _reader_left() -> int:
    """``gpulayer jobs | head -2``: the reader has what it wanted, which is no error.
    Whatever is still buffered goes nowhere, so exiting does not fail on it again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (embedding)
        pass
    return 0


def _complete(parser: argparse.ArgumentParser) -> None:
    if "_ARGCOMPLETE" not in os.environ:  # the usual case: argcomplete not even imported
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def _completion(args: argparse.Namespace) -> int:
    from argcomplete.shell_integration import shellcode

    output.say(shellcode(["gpulayer"], shell=args.shell), raw=True)
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if args.cmd == "submit":
            hint = "; put the command after `--`, e.g. gpulayer submit -- python -c 'print(1)'"
        raise errors.ValidationError(f"unrecognized arguments: {shlex.join(extra)}{hint}")
    return args
