"""Moved to :mod:`gpulayer.client.variables`; this path stays importable: remote kernels
call ``gpulayer.variables.push``/``pull`` around a cell."""

from gpulayer.client.variables import pack, pull, push, unpack

__all__ = ["pack", "pull", "push", "unpack"]
