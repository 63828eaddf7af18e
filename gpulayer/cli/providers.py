"""``gpulayer providers``, ``gpulayer instances`` and ``gpulayer instance terminate ID``."""

import argparse
from typing import Any

from gpulayer import contracts
from gpulayer.cli import output
from gpulayer.cli.options import connect, examples, output_options


def add_parsers(sub: Any, conn: argparse.ArgumentParser) -> None:
    """Add the provider commands to the ``gpulayer`` parser."""
    providers = sub.add_parser("providers", parents=[conn, output_options()],
                               help="list the providers that start workers on demand",
                               epilog=examples("gpulayer providers"))  # fmt: skip
    providers.set_defaults(func=_providers)
    instances = sub.add_parser("instances", parents=[conn, output_options()],
                               help="list provider instances with state, age and cost",
                               epilog=examples("gpulayer instances",
                                               "gpulayer instances -o json"))  # fmt: skip
    instances.set_defaults(func=_instances)
    instance = sub.add_parser("instance", help="act on one provider instance",
                              epilog=examples("gpulayer instance terminate 1a2b3c4d"))  # fmt: skip
    actions = instance.add_subparsers(dest="action", metavar="{terminate}", required=True)
    terminate = actions.add_parser(
        "terminate", parents=[conn], help="terminate an instance now (admin)",
        epilog=examples("gpulayer instance terminate 1a2b3c4d"),
    )  # fmt: skip
    terminate.add_argument("instance_id", metavar="ID", help="the instance's id")
    terminate.set_defaults(func=_terminate)


def money(value: float) -> str:
    """``$0.0123``: a cost or price in dollars."""
    return f"${value:.4f}" if value < 1 else f"${value:.2f}"


def _providers(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        found = conn.providers()
    if args.output == "json":
        output.document(contracts.ProviderList(providers=found))
        return 0
    rows = []
    for p in found:
        for o in p.offers or [contracts.Offer(provider=p.name, name="-")]:
            gpus = f"{o.gpus}x {o.gpu_model or 'GPU'}" if o.gpus else "-"
            if o.sized_to_job:
                gpus = "as the job asks" + (f" (up to {o.gpus})" if o.gpus else "")
            backoff = p.backoff.get(o.name)
            limits = f"{p.active_instances}/{p.min_instances}-{p.max_instances}"
            note = f"backoff {backoff:g}s" if backoff else "-"
            rows.append((p.name, p.kind, o.name, gpus, str(o.cpus),
                         money(o.price_per_hour) + "/h", o.region or "-", limits,
                         note))  # fmt: skip
    output.table(("PROVIDER", "KIND", "OFFER", "GPUS", "CPUS", "PRICE", "REGION",
                  "ACTIVE/MIN-MAX", "NOTE"), rows)  # fmt: skip
    return 0


def _instances(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        found = conn.instances()
    if args.output == "json":
        output.document(contracts.InstanceList(instances=found))
        return 0
    rows = [
        (i.id, i.provider, i.offer, str(i.state), i.external_id or "-", ", ".join(i.workers),
         contracts.format_duration(i.age_seconds), money(i.cost), i.detail or i.reason or "")
        for i in found
    ]  # fmt: skip
    output.table(("ID", "PROVIDER", "OFFER", "STATE", "EXTERNAL", "WORKERS", "AGE", "COST",
                  "DETAIL"), rows)  # fmt: skip
    return 0


def _terminate(args: argparse.Namespace) -> int:
    with connect(args) as conn:
        inst = conn.terminate_instance(args.instance_id)
    output.say(f"instance {inst.id} is {inst.state}: {inst.reason or ''}")
    return 0
