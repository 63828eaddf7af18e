"""gpulayer's control plane: a Jupyter server extension (see ``app.GpulayerApp``),
shipped with its prebuilt JupyterLab sidebar (``labextension/``, built into
``jupyter_ext/labextension``)."""

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from .app import GpulayerApp

    return [{"module": "jupyter_ext", "app": GpulayerApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "gpulayer"}]
