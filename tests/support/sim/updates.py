"""Applying an UpdateExpression to an item, and a ProjectionExpression to one.

The old item is never changed: the new one shares every value the update leaves alone and
copies the maps and lists along each path it writes (old items stay readable as versions, and
as ALL_OLD answers).
"""

from __future__ import annotations

from typing import cast

from .expressions import Names, Resolved, Update, Values, get_path, resolve
from .values import SETS, Invalid, Item, Value, arithmetic, kind_of

INVALID_PATH = "The document path provided in the update expression is invalid for update"
WRONG_TYPE = "An operand in the update expression has an incorrect data type"
TYPE_WORDS = {"S": "STRING", "N": "NUMBER", "B": "BINARY", "BOOL": "BOOLEAN", "NULL": "NULL"}
TYPE_WORDS |= {"M": "MAP", "L": "LIST"}


def check_paths(update: Update, names: Names, keys: tuple[str, ...]) -> list[Resolved]:
    """DynamoDB's refusals of an update's paths before it reads the item: two that overlap
    (one is the other or inside it), or one that names a key attribute. Returns the paths
    resolved, in :meth:`Update.paths`' order (what :func:`apply_update` takes)."""
    paths = [resolve(p, names) for p in update.paths()]
    for path in paths:
        if path[0] in keys:
            raise Invalid(
                "One or more parameter values were invalid: Cannot update attribute "
                f"{path[0]}. This attribute is part of the key"
            )
    if len(set(paths)) == len(paths) and all(len(p) == 1 for p in paths):
        return paths  # distinct attributes: the common case
    for n, path in enumerate(paths):
        for other in paths[:n]:
            shorter, longer = (path, other) if len(path) <= len(other) else (other, path)
            if longer[: len(shorter)] == shorter:
                raise Invalid(
                    "Invalid UpdateExpression: Two document paths overlap with each other; must "
                    "remove or rewrite one of these paths; path one: "
                    f"{_shown(other)}, path two: {_shown(path)}"
                )
    return paths


def _shown(path: Resolved) -> str:
    return "[" + ", ".join(f"[{p}]" if isinstance(p, int) else p for p in path) + "]"


def apply_update(
    old: Item | None,
    key: Item,
    update: Update,
    names: Names,
    values: Values,
    resolved: list[Resolved] | None = None,
) -> tuple[Item, set[str]]:
    """The item after ``update`` (``old`` None: a new item of ``key``), and the top-level
    attributes it touched (UPDATED_OLD / UPDATED_NEW return those). ``resolved``: its paths
    as :func:`check_paths` returned them."""
    paths = resolved if resolved is not None else [resolve(p, names) for p in update.paths()]
    count = len(update.sets)
    computed = [(paths[n], of(old, names, values)) for n, (_, of) in enumerate(update.sets)]
    new: Item = dict(old) if old is not None else dict(key)
    touched: set[str] = set()
    for path, value in computed:
        _set(new, path, value)
        touched.add(str(path[0]))
    removes = paths[count : count + len(update.removes)]
    # Several elements of one list: the highest index first, so each names the old element.
    removes.sort(key=lambda p: -p[-1] if isinstance(p[-1], int) else 1)
    for path in removes:
        _remove(new, path)
        touched.add(str(path[0]))
    count += len(update.removes)
    for n, (_, placeholder) in enumerate(update.adds):
        path = paths[count + n]
        _set(new, path, _added(get_path(new, path), values[placeholder]))
        touched.add(str(path[0]))
    count += len(update.adds)
    for n, (_, placeholder) in enumerate(update.deletes):
        path = paths[count + n]
        _delete(new, path, values[placeholder])
        touched.add(str(path[0]))
    return new, touched


def _container(item: Item, path: Resolved) -> Value:
    """The map or list holding ``path``'s last part, copied into ``item`` along the way."""
    holder: Item = item
    name = path[0]
    value = holder.get(cast(str, name))
    if value is None:
        raise Invalid(INVALID_PATH)
    value = _copied(value)
    holder[cast(str, name)] = value
    for part in path[1:-1]:
        value = _child(value, part)
    return value


def _copied(value: Value) -> Value:
    ((kind, raw),) = value.items()
    if kind == "M":
        return {"M": dict(raw)}
    if kind == "L":
        return {"L": list(raw)}
    return value


def _child(value: Value, part: str | int) -> Value:
    """The copied child ``part`` of a (copied) map or list, put back in its place."""
    if isinstance(part, int):
        items = value.get("L")
        if items is None or part >= len(items):
            raise Invalid(INVALID_PATH)
        child = items[part] = _copied(items[part])
        return child
    members = value.get("M")
    if members is None or part not in members:
        raise Invalid(INVALID_PATH)
    child = members[part] = _copied(members[part])
    return child


def _set(item: Item, path: Resolved, value: Value) -> None:
    if len(path) == 1:
        item[cast(str, path[0])] = value
        return
    parent, last = _container(item, path), path[-1]
    if isinstance(last, int):
        items = parent.get("L")
        if items is None:
            raise Invalid(INVALID_PATH)
        if last >= len(items):
            items.append(value)
        else:
            items[last] = value
        return
    members = parent.get("M")
    if members is None:
        raise Invalid(INVALID_PATH)
    members[last] = value


def _remove(item: Item, path: Resolved) -> None:
    if len(path) == 1:
        item.pop(cast(str, path[0]), None)
        return
    parent, last = _container(item, path), path[-1]
    if isinstance(last, int):
        items = parent.get("L")
        if items is None:
            raise Invalid(INVALID_PATH)
        if last < len(items):
            del items[last]
        return
    members = parent.get("M")
    if members is None:
        raise Invalid(INVALID_PATH)
    members.pop(last, None)


def _added(old: Value | None, value: Value) -> Value:
    kind = kind_of(value)
    if kind != "N" and kind not in SETS:
        raise Invalid(
            "Invalid UpdateExpression: Incorrect operand type for operator or function; "
            f"operator: ADD, operand type: {TYPE_WORDS.get(kind, kind)}, typeSet: "
            "ALLOWED_FOR_ADD_OPERAND"
        )
    if old is None:
        return value
    if kind_of(old) != kind:
        raise Invalid(WRONG_TYPE)
    if kind == "N":
        return {"N": arithmetic(old["N"], value["N"], 1)}
    have = set(old[kind])
    return {kind: old[kind] + [m for m in value[kind] if m not in have]}


def _delete(item: Item, path: Resolved, value: Value) -> None:
    kind = kind_of(value)
    if kind not in SETS:
        raise Invalid(
            "Invalid UpdateExpression: Incorrect operand type for operator or function; "
            f"operator: DELETE, operand type: {TYPE_WORDS.get(kind, kind)}"
        )
    old = get_path(item, path)
    if old is None:
        return
    if kind_of(old) != kind:
        raise Invalid(WRONG_TYPE)
    gone = set(value[kind])
    left = [m for m in old[kind] if m not in gone]
    if left:
        _set(item, path, {kind: left})
    else:
        _remove(item, path)


def project(item: Item, paths: list[Resolved]) -> Item:
    """The parts of ``item`` that ``paths`` name (a ProjectionExpression), nested as in the
    item; list elements keep their order."""
    out: Item = {}
    for path in paths:
        value = get_path(item, path)
        if value is not None:
            _place(out, item, path, value)
    _lists(out)
    return out


def _place(out: Item, item: Item, path: Resolved, value: Value) -> None:
    if len(path) == 1:
        out[cast(str, path[0])] = value
        return
    name = cast(str, path[0])
    target = out.get(name)
    if target is None:
        target = out[name] = {"M": {}} if "M" in item[name] else {"L": {}}
    for n, part in enumerate(path[1:], start=1):
        last = n == len(path) - 1
        slot = target["M"] if "M" in target else target["L"]  # a dict while building
        if last:
            slot[part] = value
            break
        if part not in slot:
            source = get_path(item, path[: n + 1]) or {}
            slot[part] = {"M": {}} if "M" in source else {"L": {}}
        target = slot[part]


def _lists(out: Item) -> None:
    """Lists built as {index: value} while projecting, made lists (in index order)."""
    for name, value in out.items():
        out[name] = _listed(value)


def _listed(value: Value) -> Value:
    if "L" in value and isinstance(value["L"], dict):
        return {"L": [_listed(value["L"][i]) for i in sorted(value["L"])]}
    if "M" in value:
        return {"M": {k: _listed(v) for k, v in value["M"].items()}}
    return value
