"""``python -m jupyter_ext``: the control plane alone, in a plain tornado server.

What ``gpulayer up`` (``LocalCluster``) starts. It serves
:class:`~jupyter_ext.service.GpulayerService`'s routes, the same handler classes a
Jupyter server mounts for the extension, without the rest of a Jupyter server: no
contents, kernels, sessions, terminals, templates or other extensions, none of
which a headless control plane ever served anyone, and whose import was a third
of its start (ADR 0157).

It takes the command line a Jupyter server would (``--GpulayerApp.*`` for the
control plane; ``--ServerApp.ip``, ``port``, ``base_url``, ``certfile``,
``keyfile``, ``allow_remote_access`` and ``local_hostnames`` for where and how it
listens; other ``ServerApp`` options are a Jupyter server's and are ignored), and
reads ``c.GpulayerApp.*`` from the same Jupyter config files
(``jupyter_server_config`` and ``jupyter_gpulayer_config`` in Jupyter's config
path). Jupyter's own token (``JUPYTER_TOKEN``, ``--IdentityProvider.token``) is
still the Jupyter user on the gpulayer routes, as in a Jupyter server (ADR 0005).
"""

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import ssl
from typing import Any

from jupyter_core.paths import jupyter_config_path
from jupyter_server.auth.authorizer import AllowAllAuthorizer
from jupyter_server.auth.identity import IdentityProvider
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets import Bool, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Application, Config, Configurable

from .service import EXTENSION_NAME, GpulayerService, endpoint_of, route_table

#: The Jupyter config files whose ``c.GpulayerApp.*`` (and ``c.ServerApp.*`` options
#: below) a headless control plane reads, as the extension inside a Jupyter server does.
CONFIG_FILES = ("jupyter_server_config", "jupyter_gpulayer_config")
#: Where a Jupyter server's options are (``--ServerApp.port=...``).
SERVER_SECTION = "ServerApp"
MIB = 1024 * 1024


class ServerOptions(Configurable):
    """Where and how the headless control plane listens: the ``ServerApp`` options of
    those names (a Jupyter server's defaults), so one command line starts either."""

    ip = Unicode("localhost", help="Address to listen on ('' or '*': every address).").tag(
        config=True
    )
    port = Int(8888, help="Port to listen on.").tag(config=True)
    base_url = Unicode("/", help="Path prefix of every route.").tag(config=True)
    certfile = Unicode("", help="TLS certificate (PEM); TLS is on when given.").tag(config=True)
    keyfile = Unicode("", help="The certificate's private key (PEM).").tag(config=True)
    allow_remote_access = Bool(
        help="Answer requests whose Host header names no local address (default: when"
        " listening beyond loopback), as a Jupyter server does against DNS rebinding."
    ).tag(config=True)
    local_hostnames = List(
        Unicode(), ["localhost"], help="Host names taken as local when remote access is off."
    ).tag(config=True)
    max_body_size = Int(512 * MIB, help="Largest request body tornado reads.").tag(config=True)
    max_buffer_size = Int(512 * MIB, help="Largest body tornado buffers.").tag(config=True)

    @validate("ip")
    def _all_addresses(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        return "" if value == "*" else value

    @validate("base_url")
    def _slashed(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        return "/" + value.strip("/") + "/" if value.strip("/") else "/"

    @default("allow_remote_access")
    def _remote_when_not_loopback(self) -> bool:
        if self.ip == "":
            return True
        try:
            return not ipaddress.ip_address(self.ip).is_loopback
        except ValueError:  # a name: local when every address it has is loopback
            try:
                infos = socket.getaddrinfo(self.ip, self.port, 0, socket.SOCK_STREAM)
            except OSError:
                return True
            return not all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)

    @classmethod
    def from_config(cls, config: Config) -> "ServerOptions":
        """The options of ``config``'s ``ServerApp`` section this class knows; the
        others are a Jupyter server's (``open_browser``, ``root_dir``, ...)."""
        known = set(cls.class_trait_names(config=True))
        section = config.get(SERVER_SECTION, {})
        mine = {k: v for k, v in section.items() if k in known}
        return cls(config=Config({cls.__name__: mine}))

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``certfile`` and ``keyfile``, or None without TLS."""
        if not self.certfile:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.certfile, self.keyfile or None)
        return ctx


def handlers(base_url: str) -> list[tuple[str, type[web.RequestHandler], dict[str, Any]]]:
    """The route table under ``base_url``, as a Jupyter server mounts it."""
    prefix = base_url.rstrip("/")
    return [
        (
            prefix + pattern,
            h,
            {"name": EXTENSION_NAME} if issubclass(h, ExtensionHandlerMixin) else {},
        )
        for pattern, h in route_table()
    ]


class ControlPlaneServer(Application):
    """``python -m jupyter_ext``: parse the command line and the config files, listen,
    run the control plane until SIGTERM or SIGINT, then stop it."""

    name = "gpulayer-control-plane"
    description = "gpulayer control plane (headless): what `gpulayer up` starts"
    classes = [GpulayerService, ServerOptions, IdentityProvider]

    @default("log_level")
    def _info(self) -> int:
        return logging.INFO

    @default("log_format")
    def _jupyter_like_format(self) -> str:
        return "[%(levelname)1.1s %(asctime)s.%(msecs).03d %(name)s] %(message)s"

    @default("log_datefmt")
    def _jupyter_like_datefmt(self) -> str:
        return "%Y-%m-%d %H:%M:%S"

    def initialize(self, argv: list[str] | None = None) -> None:
        """Read the command line, then the config files (the command line wins)."""
        self.parse_command_line(argv)
        for name in CONFIG_FILES:  # traitlets merges the command line in after each file
            self.load_config_file(name, path=jupyter_config_path())
        tornado_log = logging.getLogger("tornado")  # its errors in our log, at our level
        tornado_log.propagate = True
        tornado_log.parent = self.log
        tornado_log.setLevel(self.log.level)

    def log_request(self, handler: web.RequestHandler) -> None:
        """One line per request, at debug for a success (a call is several requests)."""
        status = handler.get_status()
        if status < 300 or status == 304:
            level = logging.DEBUG
        elif status < 500:
            level = logging.WARNING if status >= 400 else logging.INFO
        else:
            level = logging.ERROR
        if self.log.isEnabledFor(level):
            ms = 1000.0 * handler.request.request_time()
            self.log.log(level, "%d %s %s %.2fms", status, handler.request.method,
                         handler.request.uri, ms)  # fmt: skip

    async def serve(self) -> int:
        """Listen, start the control plane and serve until told to stop; the exit status."""
        try:  # a value of the wrong kind, or out of its choices: one line, no traceback
            opts = ServerOptions.from_config(self.config)
            service = GpulayerService(config=self.config, log=self.log)
            identity = IdentityProvider(config=self.config, log=self.log)
            tls = opts.ssl_context()
        except (TraitError, ValueError) as e:
            self.log.critical("gpulayer: bad configuration: %s", e)
            return 2
        except OSError as e:  # ssl.SSLError is one: a key that does not fit, a PEM that is not
            self.log.critical("gpulayer: cannot serve TLS with %s: %s", opts.certfile, e)
            return 2
        service.headless = True
        settings: dict[str, Any] = {
            "base_url": opts.base_url,
            "cookie_secret": os.urandom(32),
            "xsrf_cookies": True,
            "allow_remote_access": opts.allow_remote_access,
            "local_hostnames": opts.local_hostnames,
            "identity_provider": identity,
            "authorizer": AllowAllAuthorizer(config=self.config, identity_provider=identity),
            # Jupyter's default is True; every gpulayer verb is marked to pass (it
            # authenticates itself): an unmarked one would fail closed here.
            "allow_unauthenticated_access": False,
            "log_function": self.log_request,
            "serverapp": None,
            "config": self.config,
        }
        service.prepare_plane(settings)  # exits with one line when the data dir is another's
        app = web.Application(handlers(opts.base_url), **settings)
        server = HTTPServer(app, ssl_options=tls, max_body_size=opts.max_body_size,
                            max_buffer_size=opts.max_buffer_size)  # fmt: skip
        try:
            server.add_sockets(bind_sockets(opts.port, opts.ip or None))
        except OSError as e:
            self.log.critical("gpulayer: the control plane could not listen: port %d is not"
                              " available (%s)", opts.port, e.strerror or e)  # fmt: skip
            await service.stop_plane()
            return 1
        service.listening(opts.port)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        try:
            await service.start_plane(endpoint_of(opts.ip, opts.port, opts.base_url, opts.certfile))
            scheme = "https" if opts.certfile else "http"
            self.log.info("gpulayer control plane serving at %s://%s:%d%s", scheme,
                          opts.ip or "*", opts.port, opts.base_url)  # fmt: skip
            await stopping.wait()
            self.log.info("gpulayer control plane stopping")
        finally:
            server.stop()  # no new connections; open ones end with the process
            await service.stop_plane()
        return 0


def main(argv: list[str] | None = None) -> None:
    """Run a headless control plane (``python -m jupyter_ext``)."""
    app = ControlPlaneServer()
    app.initialize(argv)
    raise SystemExit(asyncio.run(app.serve()))
