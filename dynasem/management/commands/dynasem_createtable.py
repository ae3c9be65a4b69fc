from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ... import checks
from ..._storage import dynamodb, records, schema
from ...exceptions import SemaphoreUnavailable
from ._output import refused

# What DescribeTimeToLive says of a TTL that is on (or being turned on).
TTL_ON = ("ENABLED", "ENABLING")


class Command(BaseCommand):
    help = (
        "Create the DynamoDB lock table (on-demand billing, a GSI on userId, a sharded GSI on "
        "expires), write its stored format version and turn on TTL on expires. Safe to run "
        "again. --check only says whether the table is one this dynasem can use."
    )
    # The settings' checks, not the table's (dynasem.E014): this command is what writes the
    # format version that check asks for, and --check asks it itself.
    requires_system_checks = [checks.SETTINGS_TAG]

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--wait", action="store_true", help="wait until the table is ACTIVE")
        parser.add_argument(
            "--dry-run", action="store_true", help="print the table definition, create nothing"
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="change nothing: exit non-zero unless the table exists in one region (no "
            "global table), has dynasem's indexes and names the stored format version this "
            "dynasem reads and writes",
        )
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object: what was done"
        )

    def handle(
        self, *args: Any, wait: bool, dry_run: bool, check: bool = False, **options: Any
    ) -> None:
        if dry_run and check:  # each changes nothing; together, one went unsaid
            raise CommandError(
                "--dry-run and --check do not go together: --dry-run prints the table "
                "dynasem_createtable would make, --check says whether the existing one will do"
            )
        definition = records.table_definition()
        name = definition["TableName"]
        as_json = options.get("json", False)
        facts: dict[str, Any] = {"table": name, "endpoint": dynamodb.endpoint_label()}
        if dry_run:
            if as_json:
                self.stdout.write(json.dumps({**facts, "dry_run": True, "definition": definition}))
                return
            self.stdout.write(f"Would create table {name!r} at {dynamodb.endpoint_label()}:")
            self.stdout.write(json.dumps(definition, indent=2))
            self.stdout.write(
                f"then write its stored format version ({records.FORMAT_VERSION}) and turn on "
                "TTL on 'expires'."
            )
            return
        with refused():
            if check:
                message = self.check_table(name, facts)
            else:
                message = self.ensure_table(definition, wait=wait, facts=facts)
        if as_json:
            self.stdout.write(json.dumps({**facts, "message": message}))
        elif options.get("verbosity", 1) >= 1:  # 0: silent, as Django's own commands are
            self.stdout.write(message)

    def ensure_table(self, definition: dict[str, Any], *, wait: bool, facts: dict[str, Any]) -> str:
        name = definition["TableName"]
        existing = schema.describe_table()
        if existing is None and schema.create_table(definition) is None:
            # Made meanwhile (another dynasem_createtable at the same time): as if found.
            existing = schema.describe_table()
            if existing is None:
                raise CommandError(f"table {name!r} is being created or deleted: run this again")
        facts["created"] = existing is None
        if existing is not None:
            _our_indexes(name, existing)
            _one_region(name, existing)
            _ttl_on_expires(name)
            message = f"Table {name!r} already exists ({existing.get('TableStatus')})."
        else:
            message = f"Created table {name!r} at {dynamodb.endpoint_label()}."
        # ACTIVE: a step that fails now fails for a cause of its own (permissions, an
        # outage), which running this again "once the table is ACTIVE" does not mend.
        active = existing is not None and existing.get("TableStatus") == "ACTIVE"
        if wait:
            schema.wait_until_active(name)
            if not active:  # a table found ACTIVE says so once, in its "already exists"
                message += " It is ACTIVE."
            facts["active"] = active = True
        message += self.write_format(name, facts, active=active)
        facts["ttl"] = True
        if schema.ttl_status(name)[0] not in TTL_ON:
            try:
                schema.enable_ttl(name)
            except SemaphoreUnavailable as exc:
                if schema.ttl_status(name)[0] in TTL_ON:
                    return message + " TTL is on for 'expires'."  # turned on meanwhile
                facts["ttl"] = False
                if active:
                    raise CommandError(f"{message} TTL could not be turned on: {exc}") from exc
                return message + _not_yet("TTL could not be turned on", exc)
        return message + " TTL is on for 'expires'."

    def write_format(self, name: str, facts: dict[str, Any], *, active: bool = False) -> str:
        """The table's stored format version written, if it names none yet; what to say.
        ``active``: the table is ACTIVE (a failure is then no "not yet": CommandError)."""
        try:
            found = schema.write_format()
        except SemaphoreUnavailable as exc:
            facts["format"] = None
            if active:
                raise CommandError(
                    f"table {name!r} is ACTIVE, but its stored format version could not be "
                    f"written: {exc}"
                ) from exc
            # A table just created is not ACTIVE yet on AWS: nothing can be written to it.
            return _not_yet("Its stored format version could not be written", exc)
        facts["format"] = found
        problem = schema.format_problem(found)
        if problem is not None:
            raise CommandError(problem)
        return f" It holds stored format version {found}."

    def check_table(self, name: str, facts: dict[str, Any]) -> str:
        """Whether the table is one this dynasem can use, read only; CommandError if not."""
        existing = schema.describe_table()
        if existing is None:
            raise CommandError(
                f"table {name!r} does not exist at {dynamodb.endpoint_label()}, and this "
                f"dynasem needs one of stored format version {records.FORMAT_VERSION}: run "
                "`manage.py dynasem_createtable` to create it"
            )
        _our_indexes(name, existing)
        _one_region(name, existing)
        _ttl_on_expires(name)
        found = facts["format"] = schema.stored_format()
        problem = schema.format_problem(found)
        if problem is not None:
            raise CommandError(problem)
        return f"Table {name!r} holds stored format version {found}, as this dynasem needs."


def _not_yet(what: str, exc: Exception) -> str:
    """What could not be done yet to a table not ACTIVE yet (one just created, on AWS)."""
    return f" {what} yet ({exc}); run this again once the table is ACTIVE (or use --wait)."


def _our_indexes(name: str, existing: dict[str, Any]) -> None:
    """CommandError unless the described table has dynasem's key and indexes (their keys
    and what they project: a listing reads ``mode`` from the index)."""
    have = {g["IndexName"]: g for g in existing.get("GlobalSecondaryIndexes", [])}
    wanted = records.table_definition(name)
    missing = {g["IndexName"] for g in wanted["GlobalSecondaryIndexes"]} - set(have)
    if missing:
        raise CommandError(
            f"table {name!r} exists but lacks the index(es) {', '.join(sorted(missing))}: "
            "it was not made by dynasem_createtable; delete it or set another TABLE_NAME"
        )
    differs = [] if existing.get("KeySchema") == wanted["KeySchema"] else ["the table's key"]
    # A key attribute of another type (expires as S, a hand-made table's) takes the format
    # item, which has no index key, but refuses every lock row's write (a ValidationException).
    kinds = {
        a["AttributeName"]: a["AttributeType"] for a in existing.get("AttributeDefinitions", [])
    }
    differs += [
        f"the type of {a['AttributeName']!r} ({kinds.get(a['AttributeName'])}, not "
        f"{a['AttributeType']})"
        for a in wanted["AttributeDefinitions"]
        if kinds.get(a["AttributeName"]) != a["AttributeType"]
    ]
    for index in wanted["GlobalSecondaryIndexes"]:
        found = have[index["IndexName"]]
        if found.get("KeySchema") != index["KeySchema"]:
            differs.append(f"the key of {index['IndexName']}")
        elif _projected(found) != _projected(index):
            differs.append(f"what {index['IndexName']} projects")
    if differs:
        raise CommandError(
            f"table {name!r} exists but {' and '.join(differs)} differ from dynasem's "
            "(`dynasem_createtable --dry-run` prints them): it was not made by "
            "dynasem_createtable; delete it or set another TABLE_NAME"
        )


def _ttl_on_expires(name: str) -> None:
    """CommandError if the table's TTL is on another attribute than ``expires`` (a table has
    one, turned on by hand): dynasem's idle rows, queue entries and tombstones would never
    expire, and turning it on for ``expires`` is refused meanwhile."""
    status, attribute = schema.ttl_status(name)
    if status in TTL_ON and attribute != "expires":
        raise CommandError(
            f"table {name!r} has TTL on {attribute!r}, not 'expires' (DynamoDB allows one TTL "
            "attribute per table): turn it off and run `manage.py dynasem_createtable` to turn "
            "it on for 'expires', or set another TABLE_NAME"
        )


def _one_region(name: str, existing: dict[str, Any]) -> None:
    """CommandError if the described table is a global table (replicas in other regions):
    each region decides a conditional write on its own copy, and with eventual consistency
    (the default) replicates it later, the last writer winning, so a host writing through
    another region can take a lock held through this one."""
    regions = sorted(r.get("RegionName", "?") for r in existing.get("Replicas", []))
    if not regions:
        return
    if existing.get("MultiRegionConsistency") == "STRONG":
        why = (
            "multi-Region strong consistency has no transactions, which holds of several "
            "resources need"
        )
    else:
        why = (
            "DynamoDB replicates a write to the other regions asynchronously and the last "
            "writer wins, so hosts writing through two regions can both take one lock"
        )
    raise CommandError(
        f"table {name!r} is a global table (replicas in {', '.join(regions)}): {why}. dynasem "
        "needs a table in one region: remove the replicas, or set another TABLE_NAME"
    )


def _projected(index: dict[str, Any]) -> tuple[str, frozenset[str]]:
    projection = index.get("Projection", {})
    return projection.get("ProjectionType", ""), frozenset(projection.get("NonKeyAttributes", ()))
