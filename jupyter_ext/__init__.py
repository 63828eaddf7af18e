"""gpulayer's control plane: a Jupyter server extension (see ``app.GpulayerApp``)."""

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import GpulayerApp

    return [{"module": "jupyter_ext", "app": GpulayerApp}]
