"""Thin REST handlers by route group, over the control plane's services.

``base.py`` holds the handler base (authentication, parsing, long polls) and the
state the app publishes; ``errors.py`` the one error map. Each other module is one
route group with its ``ROUTES`` table (paths relative to the API prefix).
"""

from . import (
    channel,
    health,
    jobs,
    kernel_channel,
    prometheus,
    providers,
    secrets,
    sessions,
    storage,
    tokens,
    training,
    worker_facing,
    workers,
)
from .base import GpulayerAPIHandler

#: Every route under the API prefix, in mount order.
ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = (
    health.ROUTES
    + jobs.ROUTES
    + sessions.ROUTES
    + workers.ROUTES
    + worker_facing.ROUTES
    + tokens.ROUTES
    + training.ROUTES
    + storage.ROUTES
    + secrets.ROUTES
    + providers.ROUTES
)
#: The live channel's WebSocket routes under the API prefix (docs/channel.md).
CHANNEL_ROUTES: list[tuple[str, type[channel.ChannelHandler]]] = (
    channel.ROUTES + kernel_channel.ROUTES
)
#: Routes beside the API (relative to ``<base_url>gpulayer/``).
OUTER_ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = prometheus.ROUTES
