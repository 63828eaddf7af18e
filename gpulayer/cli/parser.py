"""The ``gpulayer`` parser and :func:`main`: parse, run the command, map errors to one line."""

import argparse
import shlex
from collections.abc import Sequence

from pydantic import ValidationError as PydanticValidationError

from gpulayer import __version__, errors
from gpulayer.cli import jobs, logs, output, sessions, tokens, up, workers
from gpulayer.cli.options import Parser, connection_options
from gpulayer.client import Connection
from gpulayer.client.specs import pydantic_to_gpulayer

_DESCRIPTION = "The ``gpulayer`` command line."


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpulayer`` command."""
    conn = connection_options()
    parser = Parser(prog="gpulayer", parents=[conn], description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpulayer {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for group in (up, jobs, logs, workers, sessions, tokens):
        group.add_parsers(sub, conn)
    return parser


def main(argv: Sequence[str] | None = None, *, connection: Connection | None = None) -> int:
    """Run the ``gpulayer`` command; returns the exit code.

    Parameters
    ----------
    argv
        Arguments without the program name (default: ``sys.argv[1:]``).
    connection
        Use this connection instead of resolving ``--url``/``--token`` (for
        embedding and tests).
    """
    try:
        args = _parse(build_parser(), argv)
        args.connection = connection
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else 0
    except errors.GpulayerError as e:
        return output.fail(e.message, 2 if isinstance(e, errors.ValidationError) else 1)
    except PydanticValidationError as e:  # a model a command built from its flags
        return output.fail(pydantic_to_gpulayer(e).message, 2)
    except (OSError, TimeoutError) as e:
        return output.fail(str(e) or type(e).__name__, 1)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = ""
        if args.cmd == "submit":
            hint = "; put the command after `--`, e.g. gpulayer submit -- python -c 'print(1)'"
        raise errors.ValidationError(f"unrecognized arguments: {shlex.join(extra)}{hint}")
    return args
