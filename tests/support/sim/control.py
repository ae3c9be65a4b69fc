"""The control plane: tables (made ACTIVE at once, as DynamoDB Local makes them) and TTL."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from .requests import DynamoError
from .tables import IndexDef, Table
from .values import Invalid

if TYPE_CHECKING:
    from .dynamodb import SimDynamoDB

ARN = "arn:aws:dynamodb:ddblocal:000000000000:table/"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def create_table(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    name = str(params.get("TableName") or "")
    if name in db.tables:
        raise DynamoError("ResourceInUseException", "Cannot create preexisting table")
    definitions = [dict(d) for d in params.get("AttributeDefinitions") or []]
    types = {d["AttributeName"]: d["AttributeType"] for d in definitions}
    hash_name, range_name = _key_schema(params.get("KeySchema") or [], types)
    indexes = {}
    for definition in params.get("GlobalSecondaryIndexes") or []:
        index = _index(definition, types)
        indexes[index.name] = index
    created = datetime.datetime.fromtimestamp(db.now(), tz=datetime.UTC)
    billing = params.get("BillingMode", "PROVISIONED")
    table = Table(
        name,
        hash_name,
        types[hash_name],
        range_name,
        None if range_name is None else types[range_name],
        definitions,
        indexes,
        created,
        {"BillingMode": billing, "LastUpdateToPayPerRequestDateTime": created},
    )
    db.tables[name] = table
    return {"TableDescription": _description(table, params.get("KeySchema") or [])}


def _key_schema(schema: list[dict[str, str]], types: dict[str, str]) -> tuple[str, str | None]:
    kinds = {k["KeyType"]: k["AttributeName"] for k in schema}
    if "HASH" not in kinds:
        raise Invalid(
            "No Hash Key specified in schema.  All Dynamo DB tables must have exactly one hash key"
        )
    for name in kinds.values():
        if name not in types:
            raise Invalid(
                "One or more parameter values were invalid: Some index key attributes are not "
                "defined in AttributeDefinitions. Keys: ["
                + name
                + "], AttributeDefinitions: ["
                + ", ".join(types)
                + "]"
            )
    return kinds["HASH"], kinds.get("RANGE")


def _index(definition: dict[str, Any], types: dict[str, str]) -> IndexDef:
    hash_name, range_name = _key_schema(definition["KeySchema"], types)
    projection = definition.get("Projection") or {"ProjectionType": "ALL"}
    return IndexDef(
        name=definition["IndexName"],
        hash_name=hash_name,
        range_name=range_name,
        projection=projection.get("ProjectionType", "ALL"),
        include=tuple(projection.get("NonKeyAttributes", ())),
        definition={
            k: definition[k] for k in ("IndexName", "KeySchema", "Projection") if k in definition
        },
    )


def _description(table: Table, schema: list[dict[str, str]] | None = None) -> dict[str, Any]:
    items = [r for r in table.records.values() if r.item is not None]
    description: dict[str, Any] = {
        "AttributeDefinitions": table.definitions,
        "TableName": table.name,
        "KeySchema": schema or _schema(table.hash_name, table.range_name),
        "TableStatus": "ACTIVE",
        "CreationDateTime": table.created,
        "ProvisionedThroughput": {
            "LastIncreaseDateTime": EPOCH,
            "LastDecreaseDateTime": EPOCH,
            "NumberOfDecreasesToday": 0,
            "ReadCapacityUnits": 0,
            "WriteCapacityUnits": 0,
        },
        "TableSizeBytes": sum(r.size for r in items),
        "ItemCount": len(items),
        "TableArn": ARN + table.name,
        "BillingModeSummary": dict(table.billing),
        "DeletionProtectionEnabled": False,
    }
    if table.indexes:
        description["GlobalSecondaryIndexes"] = [
            {
                **index.definition,
                "IndexStatus": "ACTIVE",
                "IndexSizeBytes": 0,
                "ItemCount": 0,
                "IndexArn": f"{ARN}{table.name}/index/{index.name}",
            }
            for index in table.indexes.values()
        ]
    return description


def _schema(hash_name: str, range_name: str | None) -> list[dict[str, str]]:
    schema = [{"AttributeName": hash_name, "KeyType": "HASH"}]
    if range_name is not None:
        schema.append({"AttributeName": range_name, "KeyType": "RANGE"})
    return schema


def describe_table(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    return {"Table": _description(db.table(params))}


def delete_table(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    description = _description(table)
    del db.tables[table.name]
    return {"TableDescription": description}


def list_tables(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    return {"TableNames": sorted(db.tables)}


def describe_time_to_live(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    if not table.ttl_enabled:
        return {"TimeToLiveDescription": {"TimeToLiveStatus": "DISABLED"}}
    status = {"TimeToLiveStatus": "ENABLED", "AttributeName": table.ttl_attribute}
    return {"TimeToLiveDescription": status}


def update_time_to_live(db: SimDynamoDB, params: dict[str, Any]) -> dict[str, Any]:
    table = db.table(params)
    spec = dict(params.get("TimeToLiveSpecification") or {})
    enabled = bool(spec.get("Enabled"))
    if enabled == table.ttl_enabled:
        raise Invalid(f"TimeToLive is already {'enabled' if enabled else 'disabled'}")
    table.ttl_enabled = enabled
    table.ttl_attribute = str(spec.get("AttributeName")) if enabled else None
    if enabled:
        for record in list(table.records.values()):
            db.watch_ttl(table, record)
    return {"TimeToLiveSpecification": spec}
