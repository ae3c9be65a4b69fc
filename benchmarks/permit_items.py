"""Permit items, prototyped: what the next layout of counting holds would cost (issue 22).

    .venv/bin/python benchmarks/permit_items.py [--limits 2 64 512] [--cycles 20]

Not dynasem's code: the raw writes of the layout ``docs/SCALE.md`` designs ("Next: counting
holders in permit items"), sent with boto3 to a DynamoDB Local of this script's own, on a
table made by ``dynasem_createtable`` (so its indexes bill as they would). For each limit N:
fill N - 1 permits (8 users), then ``--cycles`` acquire + release of one more; per cycle:

* acquire: one write to the lock row draws the fence (``SET fence = fence + 1``) and pops a
  free-slot hint (``REMOVE free[0]``, the old row returned); with no hint, ``ADD hw 1``
  (conditional on ``hw < N``) names a slot never used; then one conditional write takes the
  slot item (``sk = s#<slot>``: free, or its lease long over);
* release: one write frees the slot item (conditional on our token), one appends its number
  to the row's hints.

Printed: WCU (table and index) and requests per cycle. The row stays ~100 B whatever N.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


class Sender:
    def __init__(self, client: Any, table: str) -> None:
        self.client, self.table = client, table
        self.wcu = self.index_wcu = 0.0
        self.requests = 0

    def reset(self) -> None:
        self.wcu = self.index_wcu = 0.0
        self.requests = 0

    def update(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.update(TableName=self.table, ReturnConsumedCapacity="INDEXES")
        self.requests += 1
        try:
            response: dict[str, Any] = self.client.update_item(**kwargs)
        except self.client.exceptions.ConditionalCheckFailedException:
            self.wcu += 1  # AWS bills a refused conditional write 1 WCU
            raise
        consumed = response.get("ConsumedCapacity") or {}
        self.wcu += (consumed.get("Table") or {}).get("CapacityUnits", 0.0)
        for index in (consumed.get("GlobalSecondaryIndexes") or {}).values():
            self.index_wcu += index.get("CapacityUnits", 0.0)
        return response


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def cycles(send: Sender, limit: int, count: int) -> dict[str, float]:
    resource = common.new_name(f"permits-{limit}")

    def key(sk: str) -> dict[str, Any]:
        return {"pk": {"S": resource}, "sk": {"S": sk}}

    send.update(
        Key=key("lock"),
        UpdateExpression="SET #free = :none, #fence = :zero, #hw = :zero, #lim = :lim",
        ExpressionAttributeNames={"#free": "free", "#fence": "fence", "#hw": "hw", "#lim": "limit"},
        ExpressionAttributeValues={":none": {"L": []}, ":zero": n(0), ":lim": n(limit)},
    )

    def take(token: str, user: str) -> int:
        old = send.update(
            Key=key("lock"),
            UpdateExpression="SET #fence = #fence + :one REMOVE #free[0]",
            ConditionExpression="#lim = :lim",
            ExpressionAttributeNames={"#fence": "fence", "#free": "free", "#lim": "limit"},
            ExpressionAttributeValues={":one": n(1), ":lim": n(limit)},
            ReturnValues="ALL_OLD",
        )["Attributes"]
        fence = int(old["fence"]["N"]) + 1
        hints = old["free"]["L"]
        if hints:
            slot = int(hints[0]["N"])
        else:
            new = send.update(
                Key=key("lock"),
                UpdateExpression="ADD #hw :one",
                ConditionExpression="#hw < :lim",
                ExpressionAttributeNames={"#hw": "hw"},
                ExpressionAttributeValues={":one": n(1), ":lim": n(limit)},
                ReturnValues="UPDATED_NEW",
            )["Attributes"]
            slot = int(new["hw"]["N"]) - 1
        now = int(time.time() * 1000)
        ends = now + 600_000
        send.update(
            Key=key(f"s#{slot:06d}"),
            UpdateExpression=(
                "SET #k = :k, #u = :u, #e = :e, #f = :f, #a = :a, "
                "#uid = if_not_exists(#uid, :u), #shard = :shard, #exp = :exp"
            ),
            ConditionExpression="attribute_not_exists(#k) OR #e < :stale",
            ExpressionAttributeNames={
                "#k": "k",
                "#u": "u",
                "#e": "e",
                "#f": "f",
                "#a": "a",
                "#uid": "userId",
                "#shard": "shard",
                "#exp": "expires",
            },
            ExpressionAttributeValues={
                ":k": {"S": token},
                ":u": {"S": user},
                ":e": n(ends),
                ":f": n(fence),
                ":a": n(now),
                ":shard": n(3),
                ":exp": n(math.ceil(ends / 900_000) * 900),
                ":stale": n(now - 500),
            },
        )
        return slot

    def release(token: str, slot: int) -> None:
        send.update(
            Key=key(f"s#{slot:06d}"),
            UpdateExpression="REMOVE #k",
            ConditionExpression="#k = :k",
            ExpressionAttributeNames={"#k": "k"},
            ExpressionAttributeValues={":k": {"S": token}},
        )
        send.update(
            Key=key("lock"),
            UpdateExpression="SET #free = list_append(#free, :slot)",
            ExpressionAttributeNames={"#free": "free"},
            ExpressionAttributeValues={":slot": {"L": [n(slot)]}},
        )

    for i in range(limit - 1):
        take(f"holder-{i}", f"user-{i % 8}")
    send.reset()
    for i in range(count):
        release(f"cycle-{i}", take(f"cycle-{i}", "cycler"))
    return {
        "wcu": send.wcu / count,
        "index": send.index_wcu / count,
        "requests": send.requests / count,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", type=int, nargs="*", default=[2, 64, 512])
    parser.add_argument("--cycles", type=int, default=20)
    args = parser.parse_args(argv)
    with common.engine() as ddb:
        table = common.new_name("bench-permits")
        common.setup_dynasem(ddb.endpoint_url, table)
        common.create_dynasem_table()
        print(f"machine: {common.machine()}\n", flush=True)
        send = Sender(common.raw_client(ddb.endpoint_url), table)
        rows = []
        for limit in args.limits:
            r = cycles(send, limit, args.cycles)
            rows.append(
                [
                    f"limit={limit}, {limit - 1} held",
                    common.fmt(r["wcu"]),
                    common.fmt(r["index"]),
                    common.fmt(r["requests"]),
                ]
            )
    print(common.table_md(["case (per acquire + release)", "WCU", "index WCU", "requests"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
