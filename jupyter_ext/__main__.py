"""``python -m jupyter_ext``: a headless control plane (what ``gpulayer up`` starts;
:mod:`jupyter_ext.headless`, ADR 0157)."""

import sys

from gpulayer.startup import hold_gc, skip_pydantic_plugins

hold_gc()  # until the control plane is ready (ADR 0147)
skip_pydantic_plugins()  # the headless control plane uses none (ADR 0148)

# jsonschema (through jupyter_events) loads a checker for each optional string
# format whose library is installed. No gpulayer or Jupyter event schema uses a
# format, and three of them are costly: rfc3987-syntax builds a Lark grammar for
# "iri" (1.4 s of a 3.5 s start on a small machine); isoduration ("duration", with
# arrow and dateutil) and rfc3986-validator ("uri") take ~0.05 s more (ADR 0141).
# The headless control plane goes without them; only jsonschema imports these three.
# (A None entry in sys.modules makes that import fail; typeshed allows only modules.)
for _unused in ("rfc3987_syntax", "isoduration", "rfc3986_validator"):
    sys.modules.setdefault(_unused, None)  # type: ignore[arg-type]

from .headless import main  # noqa: E402

main()
