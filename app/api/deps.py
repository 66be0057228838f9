"""Dependencies: the runtime and its settings, a unit-of-work factory, the dispatcher, and
role-checked API keys.

All are `async def`: FastAPI runs a plain `def` dependency in its thread pool, and the thread
hops (four dependencies and the endpoint) were a fifth of a POST's CPU. Only a key
missing from the cache is looked up in a thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.limits import VERIFIED_KEY
from app.core.db.group_commit import GroupCommitter
from app.core.db.session import Database
from app.core.db.tables import ApiKey
from app.core.dispatch import Dispatcher
from app.core.errors import APIError
from app.core.runtime import Runtime
from app.core.security import Role
from app.core.services.isolated import UploadPool
from app.core.settings import Settings


async def get_runtime(request: Request) -> Runtime:
    """The service's resources, built once by `create_app` (app/core/runtime.py)."""
    return request.app.state.runtime


async def get_uploads(request: Request) -> UploadPool:
    """The API's pool of processes that parse uploads (app/core/services/isolated.py)."""
    return request.app.state.uploads


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.runtime.settings


async def get_db(request: Request) -> Database:
    """Units of work: `with db.read() as session:` or `with db.write() as session:`."""
    return request.app.state.db


async def get_committer(request: Request) -> GroupCommitter:
    """The single writer path: short units of work committed in groups."""
    return request.app.state.committer


async def get_dispatcher(request: Request) -> Dispatcher:
    return request.app.state.dispatcher


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
UploadsDep = Annotated[UploadPool, Depends(get_uploads)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
DbDep = Annotated[Database, Depends(get_db)]
CommitterDep = Annotated[GroupCommitter, Depends(get_committer)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]


# Declares the scheme in OpenAPI (the Authorize button of /docs); `check` reads the header
# itself so that a missing or malformed one gets Lethe's own 401 body.
BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="APIKey",
    description="An API key: `Authorization: Bearer lethe_...`. Roles: admin, requester, "
    "auditor, reader.",
)


def require(*roles: Role) -> Callable[..., Awaitable[ApiKey]]:
    """A dependency admitting keys whose role is in `roles` (admin is always admitted)."""
    allowed = {Role.admin, *roles}

    async def check(
        request: Request,
        db: DbDep,
        declared: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
    ) -> ApiKey:
        header = request.headers.get("authorization", "")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise APIError(
                401, "unauthorized", "missing API key: send 'Authorization: Bearer <key>'"
            )
        verified = getattr(request.state, VERIFIED_KEY, None)  # the ingress gate's lookup
        if verified is not None and verified[0] == raw.strip():
            key = verified[1]
        else:
            key = await request.app.state.key_cache.verified(raw.strip())
        if key is None:
            raise APIError(401, "unauthorized", "invalid or revoked API key")
        if key.role not in allowed:
            raise APIError(
                403,
                "forbidden",
                f"role {key.role!r} may not do this",
                {"allowed_roles": sorted(r.value for r in allowed)},
            )
        return key

    return check


Admin = Annotated[ApiKey, Depends(require())]
Requester = Annotated[ApiKey, Depends(require(Role.requester))]
Auditor = Annotated[ApiKey, Depends(require(Role.auditor))]
AnyRole = Annotated[ApiKey, Depends(require(Role.requester, Role.auditor, Role.reader))]
ReaderRole = Annotated[ApiKey, Depends(require(Role.reader))]
DeletionViewer = Annotated[ApiKey, Depends(require(Role.requester, Role.auditor))]
