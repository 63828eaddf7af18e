"""``gpulayer secret set | list | delete | share | unshare`` (docs/secrets.md).

A value is never taken from the command line (``ps`` and shell history show
arguments): ``set`` reads it from stdin (a prompt without echo on a terminal) or
from ``--from-file``, with one trailing newline dropped (what ``echo`` and most
editors add).
"""

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import connect, examples, output_options

_EXAMPLES = examples(
    "gpulayer secret set HF_TOKEN                     # prompts, nothing echoed",
    'printf %s "$HF_TOKEN" | gpulayer secret set HF_TOKEN',
    "gpulayer secret set GCP_KEY --from-file key.json",
    "gpulayer submit --secret HF_TOKEN -- python train.py",
    "gpulayer secret list",
    "gpulayer secret share HF_TOKEN --with ada          # admin",
)


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``secret`` and its subcommands to the ``gpulayer`` parser."""
    secret = sub.add_parser("secret", help="set, list, delete or share secrets for jobs",
                            epilog=_EXAMPLES)  # fmt: skip
    verbs = secret.add_subparsers(dest="secret_cmd", required=True, metavar="VERB")
    put = verbs.add_parser("set", parents=[conn], epilog=_EXAMPLES,
                           help="store a secret's value, read from stdin or a file")  # fmt: skip
    put.add_argument("name", metavar="NAME", help="its name, the environment variable jobs get")
    put.add_argument("--from-file", type=Path, metavar="FILE", help="read the value from FILE")
    put.add_argument("value", nargs="*", help=argparse.SUPPRESS)  # refused: see _set
    put.set_defaults(func=_set)
    listing = verbs.add_parser("list", parents=[conn, output_options()],
                               help="list secrets (names and owners, never values)",
                               epilog=examples("gpulayer secret list -o json"))  # fmt: skip
    listing.set_defaults(func=_list)
    delete = verbs.add_parser("delete", parents=[conn], help="forget a secret",
                              epilog=examples("gpulayer secret delete HF_TOKEN"))  # fmt: skip
    delete.add_argument("name", metavar="NAME", help="the secret's name")
    delete.add_argument("--owner", metavar="OWNER", help="admin: another owner's secret")
    delete.set_defaults(func=_delete)
    for verb, text in (("share", "let another owner's jobs name a secret (admin)"),
                       ("unshare", "stop sharing a secret (admin)")):  # fmt: skip
        p = verbs.add_parser(verb, parents=[conn], help=text,
                             epilog=examples(f"gpulayer secret {verb} HF_TOKEN --with ada",
                                             f"gpulayer secret {verb} HF_TOKEN --with ada"
                                             " --owner bob"))  # fmt: skip
        p.add_argument("name", metavar="NAME", help="the secret's name")
        p.add_argument("--with", dest="grantee", required=True, metavar="OWNER",
                       help="the owner whose jobs may name it")  # fmt: skip
        p.add_argument("--owner", metavar="OWNER", help="whose secret (default: yours)")
        p.set_defaults(func=_share, share=verb == "share")


def _set(args: argparse.Namespace) -> int:
    if args.value:
        return output.fail(
            "gpulayer secret set takes no value on the command line (ps and shell history"
            f" show it): pipe it in (... | gpulayer secret set {args.name}), type it at the"
            " prompt, or use --from-file FILE",
            2,
        )
    value = _read_value(args)
    if value is None:
        return output.fail(f"no value given for {args.name} (stdin was empty)", 2)
    with connect(args) as conn:
        made = conn.set_secret(args.name, value)
    print(f"secret {made.name} set for {made.owner}")
    return 0


def _read_value(args: argparse.Namespace) -> str | None:
    """The value from ``--from-file``, a prompt (stdin a terminal) or stdin."""
    if args.from_file is not None:
        text = args.from_file.read_text(encoding="utf-8")
    elif sys.stdin.isatty():
        text = getpass.getpass(f"value of {args.name} (not echoed): ")
    else:
        text = sys.stdin.read()
    text = text.removesuffix("\n").removesuffix("\r")
    return text or None


def _list(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        found = conn.secrets()
    if args.output == "json":
        output.document(contracts.SecretList(secrets=found))
        return 0
    output.table(("NAME", "OWNER", "SHARED WITH", "CREATED", "UPDATED"), [
        (s.name, s.owner, ", ".join(s.shared_with) or "-", output.when(s.created_at),
         output.when(s.updated_at))
        for s in found
    ])  # fmt: skip
    return 0


def _delete(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        conn.delete_secret(args.name, args.owner)
    print(f"deleted secret {args.name}")
    return 0


def _share(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        conn.share_secret(args.name, args.grantee, args.owner, share=args.share)
    verb = "shared" if args.share else "no longer shared"
    print(f"secret {args.name} {verb} with {args.grantee}")
    return 0
