"""Attribute values as DynamoDB's low-level API carries them (``{"S": "x"}``, ``{"N": "1"}``...):
checking and normalizing them, their size as DynamoDB bills it, equality and order.

Numbers are kept as DynamoDB returns them, normalized (``"01.50"`` reads back ``"1.5"``,
``"1E+2"`` reads back ``"100"``), so that two equal numbers are equal strings; arithmetic is
exact (:class:`~decimal.Decimal`, 38 digits).
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

Value = dict[str, Any]
Item = dict[str, Value]

SCALARS = frozenset({"S", "N", "B"})
SETS = {"SS": "S", "NS": "N", "BS": "B"}
TYPES = frozenset({"S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"})
# 38 significant digits, as DynamoDB's numbers.
NUMBERS = decimal.Context(prec=38, traps=[decimal.Inexact, decimal.InvalidOperation])
# An item's size limit (400 KB) and the write and read units' sizes.
MAX_ITEM = 400 * 1024


class Invalid(Exception):
    """A request DynamoDB refuses (``ValidationException``) with this message."""


def number(text: str) -> Decimal:
    """A wire number's value; Invalid as DynamoDB says it."""
    try:
        value = Decimal(text)
    except (decimal.InvalidOperation, TypeError, ValueError):
        raise Invalid("A value provided cannot be converted into a number") from None
    if not value.is_finite():
        raise Invalid("A value provided cannot be converted into a number")
    return value


def normal_number(text: str) -> str:
    """``text`` as DynamoDB stores and returns it (no exponent, no needless zero)."""
    if text.isdigit() and (text[0] != "0" or text == "0") and len(text) <= 38:
        return text  # the common case: a plain integer
    return format_number(number(text))


def format_number(value: Decimal) -> str:
    if value.is_zero():
        return "0"
    value = value.normalize(NUMBERS) if len(value.as_tuple().digits) <= 38 else value.normalize()
    digits = len(value.as_tuple().digits)
    if digits > 38:
        raise Invalid("Attempting to store more than 38 significant digits in a Number")
    exponent = value.adjusted()
    if exponent > 125:
        raise Invalid(
            "Number overflow. Attempting to store a number with magnitude larger than supported "
            "range"
        )
    if exponent < -130:
        raise Invalid(
            "Number underflow. Attempting to store a number with magnitude smaller than "
            "supported range"
        )
    return format(value, "f")


def arithmetic(left: str, right: str, sign: int) -> str:
    """``left + right`` (``sign`` 1) or ``left - right`` (-1), exactly."""
    try:
        result = NUMBERS.add(number(left), number(right) * sign)
    except decimal.Inexact:
        raise Invalid(
            "Number overflow. Attempting to store a number with magnitude larger than supported "
            "range"
        ) from None
    return format_number(result)


def normal_value(value: Any, where: str) -> Value:
    """A checked, normalized copy of a wire value (``where`` names it in errors, as DynamoDB
    does: ``for key :v``)."""
    try:
        return normal(value)
    except Invalid as exc:
        raise Invalid(f"{exc}{where}") from None


def normal(value: Any) -> Value:
    """A checked, normalized copy of a wire value."""
    if type(value) is not dict or len(value) != 1:
        if not isinstance(value, Mapping) or len(value) != 1:
            raise Invalid(
                "Supplied AttributeValue is empty, must contain exactly one of the supported "
                "datatypes"
            )
        value = dict(value)
    for kind, raw in value.items():
        if kind == "S":
            return {"S": raw if type(raw) is str else str(raw)}
        if kind == "N":
            return {"N": normal_number(raw if type(raw) is str else str(raw))}
        if kind == "M":
            return {"M": {k if type(k) is str else str(k): normal(v) for k, v in raw.items()}}
        if kind == "L":
            return {"L": [normal(v) for v in raw]}
        if kind in ("BOOL", "NULL"):
            return {kind: bool(raw)}
        if kind == "B":
            return {"B": _bytes(raw)}
        if kind in SETS:
            return {kind: _normal_set(kind, raw, "")}
        raise Invalid(f"Supplied AttributeValue has an unsupported datatype: {kind}")
    raise AssertionError("unreachable")


def _normal_set(kind: str, raw: Any, where: str) -> list[Any]:
    members = list(raw)
    name = {"SS": "string set", "NS": "number set", "BS": "binary set"}[kind]
    if not members:
        raise Invalid(
            f"One or more parameter values were invalid: An {name}  may not be empty{where}"
        )
    if kind == "NS":
        members = [normal_number(str(m)) for m in members]
    elif kind == "BS":
        members = [_bytes(m) for m in members]
    else:
        members = [str(m) for m in members]
    if len(set(members)) != len(members):
        shown = ", ".join(map(str, members))
        raise Invalid(
            f"One or more parameter values were invalid: Input collection [{shown}] contains "
            f"duplicates{where}"
        )
    return members


def _bytes(raw: Any) -> bytes:
    if isinstance(raw, bytes | bytearray | memoryview):
        return bytes(raw)
    return str(raw).encode()


def normal_item(item: Mapping[str, Any]) -> Item:
    return {name if type(name) is str else str(name): normal(v) for name, v in item.items()}


def copy_value(value: Value) -> Value:
    """A deep copy (strings, numbers and bytes are shared: they are immutable)."""
    ((kind, raw),) = value.items()
    if kind == "M":
        return {"M": {k: copy_value(v) for k, v in raw.items()}}
    if kind == "L":
        return {"L": [copy_value(v) for v in raw]}
    if kind in SETS:
        return {kind: list(raw)}
    return {kind: raw}


def copy_item(item: Item) -> Item:
    return {name: copy_value(value) for name, value in item.items()}


# -- size, as DynamoDB bills it --------------------------------------------------------------------


def number_size(text: str) -> int:
    """A number's bytes: one per two digits (aligned on the decimal point, as DynamoDB keeps
    them in base 100), one more, one more if negative; zero is 1 byte."""
    if text.isdigit():  # a normalized non-negative integer (the common case)
        if text == "0":
            return 1
        digits = text.rstrip("0")
        zeros = len(text) - len(digits)
        return (zeros + len(digits) - 1) // 2 - zeros // 2 + 2
    value = Decimal(text)
    if value.is_zero():
        return 1
    sign, places, exponent = value.normalize().as_tuple()
    assert isinstance(exponent, int)
    low, high = exponent // 2, (exponent + len(places) - 1) // 2
    return high - low + 2 + sign


def value_size(value: Value) -> int:
    for kind, raw in value.items():
        if kind == "S":
            return len(raw) if raw.isascii() else len(raw.encode())
        if kind == "N":
            return number_size(raw)
        if kind == "M":
            return 3 + sum(
                (len(k) if k.isascii() else len(k.encode())) + value_size(v) + 1
                for k, v in raw.items()
            )
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "L":
            return 3 + sum(value_size(v) + 1 for v in raw)
        if kind == "B":
            return len(raw)
        if kind == "NS":
            return sum(number_size(m) for m in raw)
        if kind == "SS":
            return sum(len(m.encode()) for m in raw)
        return sum(len(m) for m in raw)  # BS
    return 0


def _name_size(name: str) -> int:
    return len(name) if name.isascii() else len(name.encode())


def item_size(item: Mapping[str, Value]) -> int:
    """An item's size as DynamoDB computes it: each attribute's name and value."""
    return sum(_name_size(name) + value_size(value) for name, value in item.items())


def attribute_size(name: str, value: Value) -> int:
    """One attribute's share of :func:`item_size` (``item_size({name: value})``)."""
    return _name_size(name) + value_size(value)


# -- comparing -------------------------------------------------------------------------------------


def equal(a: Value | None, b: Value | None) -> bool:
    """``a = b`` in an expression (a missing operand equals nothing)."""
    if a is None or b is None:
        return False
    if a == b:
        return True
    ((ka, ra),) = a.items()
    ((kb, rb),) = b.items()
    if ka != kb:
        return False
    if ka in SETS:
        return set(ra) == set(rb)
    if ka == "L":
        return len(ra) == len(rb) and all(equal(x, y) for x, y in zip(ra, rb, strict=True))
    if ka == "M":
        return ra.keys() == rb.keys() and all(equal(v, rb[k]) for k, v in ra.items())
    return False  # normalized scalars: equal values are equal wire values


def order_key(value: Value | None) -> tuple[str, Any] | None:
    """A key ordering values of one scalar type as DynamoDB does (strings and binaries by
    their bytes, numbers by value); None for other types."""
    if value is None:
        return None
    ((kind, raw),) = value.items()
    if kind == "N":
        return ("N", Decimal(raw))
    if kind in ("S", "B"):
        return (kind, raw)
    return None


def compare(a: Value | None, b: Value | None) -> int | None:
    """-1, 0, 1 as ``a`` is below, equal to, above ``b``; None where DynamoDB's ``<`` is false
    either way (a missing operand, another type, a type without order)."""
    ka, kb = order_key(a), order_key(b)
    if ka is None or kb is None or ka[0] != kb[0]:
        return None
    return int(ka[1] > kb[1]) - int(ka[1] < kb[1])


def kind_of(value: Value) -> str:
    return next(iter(value))
