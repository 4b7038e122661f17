"""One home per rule (docs/architecture/contract.md, "One home per rule"), checked
over the source: the constants and helpers that were once written several times (and had
drifted apart) are defined once. The run lifecycle's and the admission counter's single writers
are checked in tests/server/runs/test_lifecycle.py."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "protocol", "worker", "learner", "lm", "asyncgrpo", "bench")


@cache
def _parsed() -> tuple[tuple[str, ast.AST], ...]:
    """Parsed once for all the checks (each only reads the trees)."""
    return tuple((module, ast.parse(text)) for module, text in _sources())


def _modules() -> Iterator[tuple[str, ast.AST]]:
    return iter(_parsed())


@cache
def _string_sets() -> tuple[tuple[str, set[str]], ...]:
    """Every tuple, list and set literal's constants, by module."""
    return tuple(
        (module, {e.value for e in node.elts if isinstance(e, ast.Constant)} - {None})
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple | ast.List | ast.Set)
    )


@cache
def _functions() -> tuple[tuple[str, ast.FunctionDef, str], ...]:
    """Every function, by module, with its source as ast.unparse writes it."""
    return tuple(
        (module, node, ast.unparse(node))
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    )


def test_terminal_statuses_are_written_once() -> None:
    """Three different TERMINAL tuples once disagreed (one counted budget_exhausted)."""
    homes = {module for module, strings in _string_sets() if {"completed", "cancelled"} <= strings}
    assert homes == {"protocol/schemas.py"}


def _hashes_a_file_it_reads(source: str) -> bool:
    return "hashlib.sha256" in source and ('"rb"' in source or "'rb'" in source)


def test_one_file_hash_helper() -> None:
    """Three file-hash helpers, two with the same name and different return types, were one
    too many: protocol.storage.sha256_file is the only function that hashes a file it reads."""
    helpers = {
        f"{module}:{node.name}"
        for module, node, source in _functions()
        if _hashes_a_file_it_reads(source)
    }
    assert helpers == {"protocol/storage.py:sha256_file"}


def test_events_are_inserted_in_one_place() -> None:
    """Every event goes through server/events (so each alarm reaches the run's webhook): a
    quarantine event inserted elsewhere once never did."""
    inserters = {
        module
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Event"
    }
    assert inserters == {"server/events/repository.py"}


@cache
def _read() -> tuple[tuple[str, str], ...]:
    return tuple(
        (path.relative_to(ROOT).as_posix(), path.read_text())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    )


def _sources() -> Iterator[tuple[str, str]]:
    return iter(_read())


def _functions_calling(*names: str) -> set[str]:
    return {
        f"{module}:{node.name}"
        for module, node, source in _functions()
        if all(name in source for name in names)
    }


def test_the_leasing_statuses_are_written_once() -> None:
    """("running", "evaluating") was spelled in four places, one of them SQL text."""
    homes = {module for module, strings in _string_sets() if strings == {"running", "evaluating"}}
    assert homes == {"protocol/schemas.py"}
    assert [m for m, text in _sources() if "'running', 'evaluating'" in text] == []


def test_the_fencing_increment_is_written_once() -> None:
    """Every grant (training, eval, the one-statement grant) and attach took fencing_seq + 1,
    and the eval cadence (evals.service.eval_first) foresaw the next grant's token so."""
    homes = {
        f"{module}:{function.name}"
        for module, function, _ in _functions()
        for node in ast.walk(function)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and ast.unparse(node.left).split(".")[-1] == "fencing_seq"
    }
    assert homes == {"server/runs/repository.py:next_fencing"}
    outside_functions = [
        module
        for module, tree in _modules()
        for node in ast.iter_child_nodes(tree)
        if isinstance(node, ast.Assign) and "fencing_seq + " in ast.unparse(node.value)
    ]
    assert outside_functions == []
    assert [m for m, text in _sources() if "fencing_seq = fencing_seq + 1" in text] == []


def test_one_seed_formula() -> None:
    """Five sha256-derived seeds in two formulas (mask, shift): one, protocol/seeds.py. The
    hash_score reward reads a score in [0, 1) off a sha256, not a seed."""
    derivers = _functions_calling("hashlib.sha256", "int.from_bytes")
    assert derivers == {"protocol/seeds.py:derived_seed", "protocol/rewards.py:hash_score"}
    in_sql = [m for m, text in _sources() if "sha256(convert_to" in text]
    assert in_sql == ["protocol/seeds.py"]


def test_one_lease_answer() -> None:
    """The training and the eval grant each built the worker's Lease answer."""
    builders = {f for f in _functions_calling("Lease(", "batch_key=") if f.startswith("server/")}
    assert builders == {"server/leases/service.py:lease_response"}


def test_one_long_poll_loop() -> None:
    loops = [m for m, text in _sources() if "time.monotonic() + min(" in text]
    assert loops == ["server/long_poll.py"]


def test_the_loss_option_types_are_written_once() -> None:
    for options in (
        {"dapo", "grpo", "dr_grpo", "cispo"},
        {"token", "sequence"},
        {"none", "tis"},
        {"group", "none"},
    ):
        homes = {module for module, strings in _string_sets() if strings == options}
        assert homes == {"protocol/run_config.py"}, options


def test_worker_rows_are_written_in_one_module() -> None:
    """Worker counters, last seen and waiting were written by the lease repositories too; the
    lease engine's one-statement units take their SET values from touch_values (through
    touch_update), the two Postgres texts (acquire's first, the grant) their SET lists from
    touch_sql."""
    writers = {
        module
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "update"
        and [ast.unparse(a) for a in node.args] == ["Worker"]
    }
    assert writers == {"server/workers/repository.py"}
    for module, text in _sources():
        for statement in text.split("UPDATE workers")[1:]:
            set_list = statement.split("SET", 1)[1].lstrip()
            assert set_list.startswith("{"), (module, statement[:80])


def test_worker_token_authentication_is_one_function() -> None:
    """Worker-token authentication was written in four places (the lease repository's join
    condition, two Postgres texts, the workers and tokens services): one definition,
    server/workers/repository.py authenticated, which the others call."""
    spelled = {
        module
        for module, text in _sources()
        if module.startswith("server/")
        and any(
            s in text
            for s in ('okens.kind == "worker"', 'oken.kind == "worker"', "t.kind = 'worker'")
        )
    }
    assert spelled == {"server/workers/repository.py"}
    definitions = [
        module
        for module, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name in ("authenticated", "authenticate_worker")
    ]
    assert definitions == ["server/workers/repository.py"]


def test_one_claim_page_for_every_kind() -> None:
    """The train and eval claims took their accepted batches in two functions: one,
    server/leases/ledger.py claim_page, by the kinds' `trained` policy."""
    pages = {
        module
        for module, text in _sources()
        if module.startswith("server/")
        and 'RolloutBatch.state == "accepted"' in text
        and "skip_locked=True" in text
    }
    assert pages == {"server/leases/ledger.py"}


def test_one_claim_pipeline_for_every_kind() -> None:
    """The train and eval claims were two pipelines (server/learner/service.py with router.py,
    server/learner/eval_router.py with server/evals/service.py): one attempt,
    server/learner/service.py claim, takes and claims the batches of every kind, and one long
    poll, server/learner/router.py waiting_claim, runs it; a kind's differences are its claim
    policy (server/learner/claims.py)."""
    for step, home in (
        ("claim_page", "server/leases/ledger.py"),
        ("claim_batch", "server/learner/repository.py"),
    ):
        callers = _functions_calling(f"{step}(") - {f"{home}:{step}"}
        assert callers == {"server/learner/service.py:_take"}, step
    polls = {
        module: text.count("long_poll(")
        for module, text in _sources()
        if module.startswith("server/") and "wakeups.LEARNER" in text and "long_poll(" in text
    }
    assert polls == {"server/learner/router.py": 1}  # in waiting_claim
    assert _functions_calling("policy.answer(") == {"server/learner/service.py:claim"}


def test_token_authentication_is_written_once() -> None:
    """Revoked and expired were a Python check (tokens service) and SQL text (the event-loop
    path of the engine before issue 27): server/tokens/repository.py revoked/expired/usable,
    read or rendered."""
    for module, text in _sources():
        if module.startswith("server/") and module != "server/tokens/repository.py":
            for spelled in (
                "t.revoked_at IS NULL",
                "t.expires_at >",
                "token.expires_at",
            ):
                assert spelled not in text, (module, spelled)


def _waits_by_hand(node: ast.FunctionDef, source: str) -> bool:
    """A loop of tries that sleeps an exponentially growing wait it computes itself."""
    pauses = "sleep(" in source or ".wait(" in source
    grows = "2 **" in source or "* 2)" in source
    return pauses and grows and any(isinstance(n, ast.For | ast.While) for n in ast.walk(node))


def test_one_retry_policy() -> None:
    """Retry with backoff was written by hand in the worker, the learner's transfers, the
    presigned transfers (protocol/transfer.py) and the LLM judge, each with its own waits:
    protocol/retrying.py (tenacity) is the one policy; no function computes its own wait."""
    by_hand = {
        f"{module}:{node.name}"
        for module, node, source in _functions()
        if _waits_by_hand(node, source)
    }
    assert by_hand == set()
