"""``sessions`` routes: start, list, read and end persistent remote kernels."""

from urllib.parse import quote

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import CreateSession, SessionList

from ..auth import requires
from .base import GpulayerAPIHandler


class SessionsHandler(GpulayerAPIHandler):
    """``GET sessions`` lists; ``POST sessions`` starts one."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self) -> None:
        """The sessions that have not ended (a submitter's own)."""
        self.reply(SessionList(sessions=await self.gl.session_service.running(self.who)))

    @allow_unauthenticated
    @requires("submitter")
    async def post(self) -> None:
        """Start a ``CreateSession``; 201 with the session, 409 when the name is taken."""
        req = self.parse(CreateSession)
        session = await self.gl.session_service.create(req, owner=self.who.name)
        self.created(session, quote(session.name))


class SessionHandler(GpulayerAPIHandler):
    """``GET sessions/{name}``; ``DELETE sessions/{name}`` ends it."""

    @allow_unauthenticated
    @requires("viewer", "submitter")
    async def get(self, name: str) -> None:
        """One session that has not ended: the caller's own, or ``?owner=``'s."""
        owner = self.get_query_argument("owner", None)
        self.reply(await self.gl.session_service.get(name, self.who, owner))

    @allow_unauthenticated
    @requires("submitter")
    async def delete(self, name: str) -> None:
        """End the session (the caller's own, or ``?owner=``'s): its kernel stops, its
        slot and GPUs are freed; 204."""
        owner = self.get_query_argument("owner", None)
        await self.gl.session_service.end(name, self.who.name, self.who, owner)
        self.no_content()


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"sessions", SessionsHandler),
    (r"sessions/(?P<name>[^/]+)", SessionHandler),
]
