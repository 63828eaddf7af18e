"""Token administration routes (admin only): mint, list, revoke.

``POST tokens`` answers the secret once (``CreatedToken.token``); nothing else
ever shows it again, because only its hash is stored.
"""

from jupyter_server.auth.decorator import allow_unauthenticated

from gpulayer.contracts import CreateToken, TokenList

from ..auth import requires
from .base import GpulayerAPIHandler


class TokensHandler(GpulayerAPIHandler):
    """``GET tokens`` lists; ``POST tokens`` mints."""

    @allow_unauthenticated
    @requires("admin")
    async def get(self) -> None:
        """Every token's record (worker session tokens included), never a secret."""
        self.reply(TokenList(tokens=await self.gl.tokens.records()))

    @allow_unauthenticated
    @requires("admin")
    async def post(self) -> None:
        """Mint a ``CreateToken``; 201 with the secret, 409 when the name is taken."""
        created = await self.gl.tokens.mint(self.parse(CreateToken))
        self.created(created, created.name)


class TokenHandler(GpulayerAPIHandler):
    """``DELETE tokens/{name}``: revoke."""

    @allow_unauthenticated
    @requires("admin")
    async def delete(self, name: str) -> None:
        """Revoke every active token with this name; open long polls of them end."""
        await self.gl.tokens.revoke(name)
        self.no_content()


ROUTES: list[tuple[str, type[GpulayerAPIHandler]]] = [
    (r"tokens", TokensHandler),
    (r"tokens/(?P<name>[^/]+)", TokenHandler),
]
