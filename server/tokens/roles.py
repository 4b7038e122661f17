"""What each role of a project token may do: the one home of the role × action table
(docs/guides/projects.md, "Project tokens and roles"; invariant 29).

An admin token acts in every project and may do everything. A project token acts in its own
project only, and only what its role allows; an action on an object of another project is
answered as if the object did not exist (404), so a token never learns what another project
holds. Learner, worker, pool-learner and registration tokens are process tokens: they call
their own routes, never these."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    owner = "owner"  # everything in the project, its tokens included
    member = "member"  # runs, sweeps, datasets: create, pause, resume, cancel, delete; and the
    # project's registration tokens
    ci = "ci"  # create runs and sweeps, upload datasets, pause/cancel the runs it created; read
    viewer = "viewer"  # read


class Action(StrEnum):
    read = "read"  # runs, sweeps, datasets, their figures, adapters, evals and ledgers
    create_run = "create_run"  # runs and sweeps
    upload_dataset = "upload_dataset"
    pause_run = "pause_run"
    resume_run = "resume_run"
    cancel_run = "cancel_run"
    delete_dataset = "delete_dataset"
    manage_registration_tokens = "manage_registration_tokens"  # the project's own
    manage_tokens = "manage_tokens"  # the project's own API tokens


_EVERYTHING = frozenset(Action)
_MEMBER = _EVERYTHING - {Action.manage_tokens}  # registration tokens included
_CI = frozenset(
    {Action.read, Action.create_run, Action.upload_dataset, Action.pause_run, Action.cancel_run}
)

ALLOWED: dict[Role, frozenset[Action]] = {
    Role.owner: _EVERYTHING,
    Role.member: _MEMBER,
    Role.ci: _CI,
    Role.viewer: frozenset({Action.read}),
}

# Actions a role may take only on the runs (and sweeps) its own token created
# (created_by_token_id).
OWN_RUNS_ONLY: dict[Role, frozenset[Action]] = {
    Role.ci: frozenset({Action.pause_run, Action.cancel_run}),
}

RUN_ACTIONS: dict[str, Action] = {
    "pause": Action.pause_run,
    "resume": Action.resume_run,
    "cancel": Action.cancel_run,
}


def allows(role: Role, action: Action) -> bool:
    return action in ALLOWED[role]


def own_runs_only(role: Role, action: Action) -> bool:
    return action in OWN_RUNS_ONLY.get(role, frozenset())
