"""``gpulayer token create | list | revoke``: token administration (admin token needed).

A new token is printed once, on stdout alone (so ``T=$(gpulayer token create ...)``
works); the control plane keeps only its hash.
"""

import argparse
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import connect, examples, output_options
from gpulayer.client import specs

_ROLES = ("admin", "submitter", "viewer", "join")
_EXAMPLES = examples(
    "T=$(gpulayer token create ci --role submitter --expires 30d)",
    "gpulayer token create gpu-box-7 --role join --single-use --expires 1h",
    "gpulayer token list --all",
    "gpulayer token revoke ci",
)


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add ``token`` and its subcommands to the ``gpulayer`` parser."""
    token = sub.add_parser("token", help="create, list or revoke gpulayer tokens",
                           epilog=_EXAMPLES)  # fmt: skip
    verbs = token.add_subparsers(dest="token_cmd", required=True, metavar="VERB")
    create = verbs.add_parser("create", parents=[conn], help="mint a token (shown once)",
                              epilog=_EXAMPLES)  # fmt: skip
    create.add_argument("name", metavar="NAME", help="a name to list and revoke it by")
    create.add_argument("--role", required=True, choices=_ROLES,
                        help="what it may do: admin, submit (submitter), read (viewer),"
                        " or register workers (join)")  # fmt: skip
    create.add_argument("--expires", metavar="DURATION", help="e.g. 12h, 30d (default: never)")
    create.add_argument("--single-use", action="store_true", help="join tokens: one worker")
    create.set_defaults(func=_create)
    listing = verbs.add_parser("list", parents=[conn, output_options()],
                               help="list tokens (never their secrets)",
                               epilog=examples("gpulayer token list --all -o json"))  # fmt: skip
    listing.add_argument("--all", action="store_true", help="also revoked, used and expired")
    listing.set_defaults(func=_list)
    revoke = verbs.add_parser("revoke", parents=[conn], help="revoke a token at once",
                              epilog=examples("gpulayer token revoke ci"))  # fmt: skip
    revoke.add_argument("name", metavar="NAME", help="every active token of this name")
    revoke.set_defaults(func=_revoke)


def _create(args: argparse.Namespace) -> int:
    req = specs.validated(
        contracts.CreateToken,
        name=args.name, role=args.role, expires=args.expires, single_use=args.single_use,
    )  # fmt: skip
    with connect(args) as conn:
        made = conn.create_token(req)
    print(made.token, flush=True)
    until = f", expires {output.when(made.expires_at)}" if made.expires_at else ""
    output.note(f"token {made.name!r} (role {made.role}{until}); it is shown only this once")
    return 0


def _list(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        tokens = [t for t in conn.tokens() if args.all or t.state == "active"]
    if args.output == "json":
        output.document(contracts.TokenList(tokens=tokens))
        return 0
    output.table(("NAME", "ROLE", "STATE", "CREATED", "EXPIRES", "WORKER"), [
        (t.name, t.role + (" (single-use)" if t.single_use else ""), t.state,
         output.when(t.created_at), output.when(t.expires_at), t.worker_id or "-")
        for t in tokens
    ])  # fmt: skip
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        conn.revoke_token(args.name)
    print(f"revoked {args.name}")
    return 0
