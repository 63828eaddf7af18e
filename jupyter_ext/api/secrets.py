"""``secrets`` routes: set, list, delete and share secrets (docs/secrets.md).

No route ever answers a value: ``PUT secrets/{name}`` takes one and answers the
record; the value leaves the control plane only in a task's assignment.
"""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import SecretList, SetSecret

from ..auth import requires
from .base import GpulayerAPIHandler


class SecretsHandler(GpulayerAPIHandler):
    """``GET secrets``: names, owners and times, never values."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """A submitter's own secrets and those shared with it; every owner's for an
        admin or a viewer."""
        self.reply(SecretList(secrets=await self.gl.secrets.records(self.who)))


class SecretHandler(GpulayerAPIHandler):
    """``PUT secrets/{name}`` sets the caller's secret; ``DELETE`` forgets it."""

    @allow_unauthenticated
    @requires("submitter")
    async def put(self, name: str) -> None:
        """Store a ``SetSecret``'s value sealed; 201 with the record when it is new,
        200 when it replaced a value (for tasks that start from now on)."""
        req = self.parse(SetSecret)
        secret = await self.gl.secrets.set(name, req, self.who)
        if secret.created_at == secret.updated_at:
            self.set_header("Location", self.request.path)
            self.reply(secret, 201)
        else:
            self.reply(secret)

    @allow_unauthenticated
    @requires("submitter")
    async def delete(self, name: str) -> None:
        """Forget the caller's secret (an admin: ``?owner=``'s); 204."""
        owner = self.get_query_argument("owner", None)
        await self.gl.secrets.delete(name, self.who, owner)
        self.no_content()


class SecretShareHandler(GpulayerAPIHandler):
    """``PUT``/``DELETE secrets/{name}/shares/{grantee}``: an admin lets another
    owner's jobs name a secret, or stops that."""

    @allow_unauthenticated
    @requires("admin")
    async def put(self, name: str, grantee: str) -> None:
        """Share the admin's own secret (or ``?owner=``'s) with ``grantee``."""
        owner = self.get_query_argument("owner", None)
        self.reply(await self.gl.secrets.share(name, grantee, self.who, owner))

    @allow_unauthenticated
    @requires("admin")
    async def delete(self, name: str, grantee: str) -> None:
        """Stop sharing it with ``grantee``; jobs of theirs that start later cannot name it."""
        owner = self.get_query_argument("owner", None)
        await self.gl.secrets.share(name, grantee, self.who, owner, on=False)
        self.no_content()


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"secrets", SecretsHandler),
    (r"secrets/(?P<name>[^/]+)", SecretHandler),
    (r"secrets/(?P<name>[^/]+)/shares/(?P<grantee>[^/]+)", SecretShareHandler),
]
