"""Moved to :mod:`gpulayer.notebook.magics`; this path stays importable."""

from gpulayer.notebook.commands import connection
from gpulayer.notebook.magics import GpulayerMagics, load
from gpulayer.notebook.render import RemoteResult, Renderer, follow

__all__ = ["GpulayerMagics", "RemoteResult", "Renderer", "connection", "follow", "load"]
