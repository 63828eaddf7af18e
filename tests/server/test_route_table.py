"""``docs/api.md``'s route tables list exactly the routes the control plane mounts.

The mounted side is read from the real Jupyter server (``jp_serverapp``): every rule
of its router under ``<base_url>gpulayer/``, and the HTTP methods its handler class
implements. The documented side is parsed from the tables under "## Routes". Each
documented ``(path, verb)`` is routed the way tornado routes a request (so the
order of the rules counts), and each mounted ``(pattern, verb)`` must be reached by
some documented row. Only URL patterns and methods are compared, never the module
a handler lives in.
"""

import re
from pathlib import Path

from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine
from tornado.routing import PathMatches, Router, RuleRouter
from tornado.web import RequestHandler

from gpulayer.contracts import API_PREFIX

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
ROW = re.compile(r"^\|\s*`(?P<route>[^`]+)`\s*\|\s*(?P<verbs>[A-Z, ]+?)\s*\|")


def documented() -> set[tuple[str, str]]:
    """``(path relative to the server's base_url, verb)`` for every row of the route tables."""
    text = API_MD.read_text()
    section = text.split("\n## Routes\n", 1)[1].split("\n## ", 1)[0]
    rows: set[tuple[str, str]] = set()
    for line in section.splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        route = m["route"].split("?", 1)[0]
        path = route.lstrip("/") if route.startswith("/") else f"{API_PREFIX.strip('/')}/{route}"
        rows |= {(path, verb.strip()) for verb in m["verbs"].split(",")}
    assert rows, f"no route table found under '## Routes' in {API_MD}"
    return rows


def implemented(handler: type[RequestHandler]) -> set[str]:
    """The HTTP methods a handler class answers (tornado's own ones answer 405)."""
    return {
        m for m in METHODS if getattr(handler, m.lower()) is not getattr(RequestHandler, m.lower())
    }


def rules(router: Router) -> list[tuple[str, type[RequestHandler]]]:
    """``(path regex, handler class)`` of every path rule, depth first, in routing order."""
    found: list[tuple[str, type[RequestHandler]]] = []
    for rule in router.rules if isinstance(router, RuleRouter) else []:
        if isinstance(rule.target, Router):
            found += rules(rule.target)
        elif isinstance(rule.matcher, PathMatches) and isinstance(rule.target, type):
            found.append((rule.matcher.regex.pattern, rule.target))
    return found


def sample(path: str) -> str:
    """A concrete request path for a documented template: ``jobs/{id}`` -> ``jobs/x1``."""
    return re.sub(r"\{[^}]+\}", "x1", path)


def routed(web_app, base_url: str, path: str, verb: str) -> type[RequestHandler] | None:
    """The handler class tornado picks for ``verb base_url+path`` (None: its 404 fallback)."""
    line = RequestStartLine(verb, base_url + path, "HTTP/1.1")
    request = HTTPServerRequest(start_line=line, headers=HTTPHeaders({"Host": "localhost"}))
    delegate = web_app.find_handler(request)
    handler = getattr(delegate, "handler_class", None)
    return None if handler is web_app.settings.get("default_handler_class") else handler


def test_docs_route_tables_match_the_mounted_routes(jp_serverapp):
    web_app = jp_serverapp.web_app
    base_url = web_app.settings["base_url"]
    mine = [
        (pattern, handler)
        for pattern, handler in rules(web_app.default_router)
        if pattern.startswith(base_url + "gpulayer/")
    ]
    assert len(mine) > 20, "found none of the control plane's routes; did the router change?"

    ours = {handler for _, handler in mine}
    docs = documented()
    unanswered = []
    for path, verb in sorted(docs):
        handler = routed(web_app, base_url, sample(path), verb)
        if handler not in ours or verb not in implemented(handler):
            unanswered.append(f"{verb} {path}")
    assert not unanswered, "docs/api.md lists routes the server does not answer: " + ", ".join(
        unanswered
    )

    def first_rule(path: str) -> str | None:  # as tornado picks it (checked just above)
        return next((p for p, _ in mine if re.match(p, base_url + path)), None)

    reached = {(first_rule(sample(path)), verb) for path, verb in docs}
    missing = [
        f"{verb} {pattern.removeprefix(base_url)}"
        for pattern, handler in mine
        for verb in sorted(implemented(handler))
        if (pattern, verb) not in reached
    ]
    assert not missing, "mounted routes missing from docs/api.md's tables: " + ", ".join(missing)


def test_the_documented_table_is_parsed():
    docs = documented()
    prefix = API_PREFIX.strip("/")
    assert (f"{prefix}/jobs", "POST") in docs and (f"{prefix}/jobs", "GET") in docs
    assert (f"{prefix}/tokens", "GET") in docs and (f"{prefix}/tokens", "POST") in docs
    assert ("gpulayer/metrics", "GET") in docs
