from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..._storage import dynamodb, records, schema
from ...exceptions import SemaphoreUnavailable


class Command(BaseCommand):
    help = (
        "Create the DynamoDB lock table (on-demand billing, a GSI on userId, a sharded GSI on "
        "expires) and turn on TTL on expires. Safe to run again."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--wait", action="store_true", help="wait until the table is ACTIVE")
        parser.add_argument(
            "--dry-run", action="store_true", help="print the table definition, create nothing"
        )
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object: what was done"
        )

    def handle(self, *args: Any, wait: bool, dry_run: bool, **options: Any) -> None:
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
            self.stdout.write("and turn on TTL on 'expires'.")
            return
        else:
            try:
                message = self.ensure_table(definition, wait=wait, facts=facts)
            except SemaphoreUnavailable as exc:
                raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps({**facts, "message": message}) if as_json else message)

    def ensure_table(
        self, definition: dict[str, Any], *, wait: bool, facts: dict[str, Any] | None = None
    ) -> str:
        facts = {} if facts is None else facts
        name = definition["TableName"]
        existing = schema.describe_table()
        facts["created"] = existing is None
        if existing is not None:
            have = {g["IndexName"] for g in existing.get("GlobalSecondaryIndexes", [])}
            missing = {records.USER_INDEX, records.EXPIRES_INDEX} - have
            if missing:
                raise CommandError(
                    f"table {name!r} exists but lacks the index(es) {', '.join(sorted(missing))}: "
                    "it was not made by dynasem_createtable; delete it or set another TABLE_NAME"
                )
            message = f"Table {name!r} already exists ({existing.get('TableStatus')})."
        else:
            schema.create_table(definition)
            message = f"Created table {name!r} at {dynamodb.endpoint_label()}."
        if wait:
            schema.wait_until_active(name)
            message += " It is ACTIVE."
            facts["active"] = True
        facts["ttl"] = True
        if schema.ttl_status(name) not in ("ENABLED", "ENABLING"):
            try:
                schema.enable_ttl(name)
                message += " TTL is on for 'expires'."
            except SemaphoreUnavailable as exc:
                facts["ttl"] = False
                message += (
                    f" TTL could not be turned on yet ({exc}); run this again once the table "
                    "is ACTIVE (or use --wait)."
                )
        else:
            message += " TTL is on for 'expires'."
        return message
