"""Request dependencies as Annotated aliases, gathered from their homes for the routers above
the workers in the feature order (docs/architecture/index.md, "Feature order"): the ones
that know no feature (server/request_deps.py), who is calling (server/tokens/auth.py) and the
calling worker (server/workers/auth.py). The tokens and workers routers, below this module,
import from those homes."""

from __future__ import annotations

from server.request_deps import (
    BEARER_SCHEMES,
    AdminCredentials,
    Credentials,
    LearnerCredentials,
    RegistrationCredentials,
    SessionDep,
    SettingsDep,
    StoreDep,
    WorkerCredentials,
    get_session,
    get_settings,
    get_store,
    refuse_unstorable_text,
    released,
)
from server.tokens.auth import (
    AdminDep,
    AnyTokenDep,
    LearnerDep,
    RegistrationDep,
    require_admin,
    require_any_token,
    require_learner,
    require_registration,
)
from server.workers.auth import as_worker, authenticated_worker

__all__ = [
    "AdminDep",
    "AnyTokenDep",
    "AdminCredentials",
    "Credentials",
    "LearnerCredentials",
    "RegistrationCredentials",
    "WorkerCredentials",
    "LearnerDep",
    "RegistrationDep",
    "SessionDep",
    "SettingsDep",
    "StoreDep",
    "BEARER_SCHEMES",
    "as_worker",
    "authenticated_worker",
    "get_session",
    "get_settings",
    "get_store",
    "refuse_unstorable_text",
    "released",
    "require_admin",
    "require_any_token",
    "require_learner",
    "require_registration",
]
