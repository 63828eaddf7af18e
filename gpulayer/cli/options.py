"""What every command shares: the parser class, the connection and output options,
examples, the connection."""

import argparse
from typing import Any, NoReturn

from gpulayer import errors
from gpulayer.client import Connection, config


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors become one gpulayer error line, and whose
    description and examples keep their line breaks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise errors.ValidationError(f"{message} (see `{self.prog} --help`)")


def bounded(kind: type[int] | type[float], lo: float, hi: float | None = None) -> Any:
    """An argparse type: a ``kind`` number in ``[lo, hi]`` (one error line otherwise)."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < lo or (hi is not None and value > hi):
            limit = f">= {lo:g}" if hi is None else f"from {lo:g} to {hi:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {what} {limit}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def connection_options() -> argparse.ArgumentParser:
    """The parent parser of ``--url``, ``--token`` and ``--fingerprint``."""
    conn = Parser(add_help=False)
    conn.add_argument("--url", default=argparse.SUPPRESS, help="control plane URL")
    conn.add_argument("--token", default=argparse.SUPPRESS, help="gpulayer token")
    conn.add_argument("--fingerprint", default=argparse.SUPPRESS, metavar="sha256:...",
                      help="pinned TLS certificate (`gpulayer up` prints it)")  # fmt: skip
    conn.add_argument("--insecure", action="store_true", default=argparse.SUPPRESS,
                      help="send the token over http:// to another host (clear text)")  # fmt: skip
    return conn


def output_options() -> argparse.ArgumentParser:
    """The parent parser of ``-o``/``--output``: a table for people, or the
    contract model's JSON for scripts."""
    out = Parser(add_help=False)
    out.add_argument("-o", "--output", choices=("table", "json"), default="table",
                     help="table (default) or json: the API's own model, one document")  # fmt: skip
    return out


def progress_options() -> argparse.ArgumentParser:
    """The parent parser of ``--progress`` / ``--no-progress``: a bar of the bytes a
    command moves, on stderr; by default only when stderr is a terminal."""
    bar = Parser(add_help=False)
    bar.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a transfer bar on stderr (default: when stderr is a terminal)",
    )
    return bar


def examples(*lines: str) -> str:
    """An ``examples:`` epilog for a command's ``--help``."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def connect(args: argparse.Namespace) -> Connection:
    """The connection the command's options (or ``main(connection=...)``) name."""
    given: Connection | None = args.connection
    if given is not None:
        return given
    cfg = config.resolve(
        getattr(args, "url", None),
        getattr(args, "token", None),
        getattr(args, "fingerprint", None),
        getattr(args, "insecure", False),
    )
    return Connection(cfg.url, cfg.token, fingerprint=cfg.fingerprint, insecure=cfg.insecure)
