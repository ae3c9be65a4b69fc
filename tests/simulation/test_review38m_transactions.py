"""Review 38m: the simulated client sends TransactWriteItems as botocore does, with a
``ClientRequestToken`` (an ``idempotencyToken`` member of DynamoDB's service model, filled in
once per call by botocore's ``generate_idempotent_uuid``), so botocore's re-send of a
transaction already applied is replayed by DynamoDB, not cancelled by its own writes."""

from __future__ import annotations

from tests.support.sim.runtime import Options, run


def test_a_resent_transaction_applied_before_is_replayed() -> None:
    """Seed 8821 of counting_pairs (permit items, exclusive holds), interrupts_heavy: a
    pair's take applied, answered with a 500, re-sent by botocore. Cancelled by the rows it
    had just written (no token), ``all_or_none`` planned again without giving back, and the
    interrupted block left both permits held ("permits left held")."""
    options = Options(
        seed=8821, mix="counting_pairs", faults="interrupts_heavy", permits_from=1, readers_from=0
    )
    result = run(options)
    result.raise_if_violated()
    resent = [
        event
        for event in result.trace
        if event[1] == "apply" and event[3] == "TransactWriteItems" and event[-1] == "error_after"
    ]
    assert resent  # the seed still reaches botocore's re-send of an applied transaction
