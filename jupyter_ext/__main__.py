"""``python -m jupyter_ext``: a headless control plane (what ``gpulayer up`` starts)."""

import sys

# jsonschema (through jupyter_events) builds a Lark grammar for its optional "iri"
# format checker when rfc3987-syntax is installed: 1.4 s of a 3.5 s start on a
# small machine. No gpulayer or Jupyter schema uses that format, so the headless
# control plane goes without it (benchmarks/results/functions.md).
# (A None entry in sys.modules makes that import fail; typeshed allows only modules.)
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

from .app import main  # noqa: E402

main()
