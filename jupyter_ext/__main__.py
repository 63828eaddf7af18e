"""``python -m jupyter_ext``: a headless control plane (what ``gpulayer up`` starts)."""

from .app import main

main()
