"""The fenced-write pattern of the README, runnable: a user's own item that refuses a write
carrying an older fence than the last one it accepted. Kept in the lock table under its own
sort key for the tests' convenience; in real use it is any item of yours."""

from __future__ import annotations

from botocore.exceptions import ClientError

from dynasem._storage import dynamodb
from dynasem.conf import settings


class FencedWriteRefused(Exception):
    pass


def fenced_put(key: str, body: str, fence: int) -> None:
    try:
        dynamodb.get_client().update_item(
            TableName=settings.TABLE_NAME,
            Key={"pk": {"S": key}, "sk": {"S": "user-data"}},
            UpdateExpression="SET body = :b, fence = :f",
            ConditionExpression="attribute_not_exists(fence) OR fence <= :f",
            ExpressionAttributeValues={":b": {"S": body}, ":f": {"N": str(fence)}},
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
            raise FencedWriteRefused(f"fence {fence} is older than the stored one") from None
        raise
