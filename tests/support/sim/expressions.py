"""DynamoDB's expressions: parsed once per text (and kind), then evaluated against items.

A parsed expression is a tree of closures: ``condition(item, names, values) -> bool`` and
``operand(item, names, values) -> value or None`` (None: the attribute is missing), where
``names`` and ``values`` are a request's ExpressionAttributeNames and (normalized)
ExpressionAttributeValues. Placeholders are looked up at evaluation, so one parse serves every
request that sends the same text with other values.

Errors are :class:`~tests.support.sim.values.Invalid` with DynamoDB (Local)'s message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .reserved import RESERVED
from .values import (
    SETS,
    Invalid,
    Item,
    Value,
    arithmetic,
    compare,
    equal,
    kind_of,
)

Names = Mapping[str, str]
Values = Mapping[str, Value]
# A path as written: names (literal, or "#placeholder") and list indexes.
Path = tuple[str | int, ...]
# A path with its placeholders resolved.
Resolved = tuple[str | int, ...]
Condition = Callable[[Item | None, Names, Values], bool]
Operand = Callable[[Item | None, Names, Values], Value | None]

_TOKEN = re.compile(
    r"\s*(?:(?P<name>#[A-Za-z0-9_]+)|(?P<value>:[A-Za-z0-9_]+)|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<num>\d+)|(?P<op><>|<=|>=|[=<>()\[\],.+\-]))"
)
COMPARATORS = frozenset({"=", "<>", "<", "<=", ">", ">="})
CONDITION_FUNCTIONS = frozenset(
    {"attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains"}
)
TYPE_NAMES = {"S": "STRING", "N": "NUMBER", "B": "BINARY", "BOOL": "BOOLEAN", "NULL": "NULL"}
TYPE_NAMES |= {"M": "MAP", "L": "LIST", "SS": "SS", "NS": "NS", "BS": "BS"}


@dataclass
class Token:
    kind: str  # name, value, ident, num, op, eof
    text: str


def tokenize(text: str, kind: str) -> list[Token]:
    tokens, at = [], 0
    text = text.rstrip()
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            bad = text[at:].strip()[:1]
            raise Invalid(f'Invalid {kind}: Syntax error; token: "{bad}", near: "{bad}"')
        group = match.lastgroup or "op"
        tokens.append(Token(group, match.group(group)))
        at = match.end()
    tokens.append(Token("eof", "<EOF>"))
    return tokens


@dataclass
class Parsed:
    """One parsed expression: what it evaluates, and the placeholders it uses."""

    kind: str
    names: set[str] = field(default_factory=set)
    values: set[str] = field(default_factory=set)
    condition: Condition | None = None
    paths: list[Path] = field(default_factory=list)  # a projection's
    update: Update | None = None
    # A key condition's parts (see key_parts).
    keys: list[tuple[str, Path, tuple[str, ...]]] = field(default_factory=list)
    # The first part of every path it reads (a literal name or a placeholder).
    heads: set[str] = field(default_factory=set)


class Parser:
    """Recursive descent over one expression's tokens (``kind``: "ConditionExpression"...)."""

    def __init__(self, text: str, kind: str) -> None:
        self.kind = kind
        self.tokens = tokenize(text, kind)
        self.at = 0
        self.parsed = Parsed(kind)

    # -- tokens --------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.at + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        token = self.peek()
        self.at += 1
        return token

    def keyword(self, word: str) -> bool:
        token = self.peek()
        if token.kind == "ident" and token.text.upper() == word:
            self.at += 1
            return True
        return False

    def op(self, text: str) -> bool:
        if self.peek().kind == "op" and self.peek().text == text:
            self.at += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.op(text):
            raise self.syntax()

    def syntax(self, back: int = 0) -> Invalid:
        at = min(self.at - back, len(self.tokens) - 1)
        token = self.tokens[at]
        around = [t.text for t in self.tokens[max(at - 1, 0) : at + 2] if t.kind != "eof"]
        if token.kind == "eof":
            around = [t.text for t in self.tokens[max(at - 1, 0) : at]]
        near = " ".join(around)
        return Invalid(f'Invalid {self.kind}: Syntax error; token: "{token.text}", near: "{near}"')

    def fail(self, message: str) -> Invalid:
        return Invalid(f"Invalid {self.kind}: {message}")

    def end(self) -> None:
        if self.peek().kind != "eof":
            raise self.syntax()

    # -- paths and operands ----------------------------------------------------------------

    def path(self) -> Path:
        parts: list[str | int] = [self.name()]
        self.parsed.heads.add(str(parts[0]))
        while True:
            if self.op("."):
                parts.append(self.name())
            elif self.op("["):
                token = self.next()
                if token.kind != "num":
                    raise self.syntax(1)
                parts.append(int(token.text))
                self.expect("]")
            else:
                return tuple(parts)

    def name(self) -> str:
        token = self.next()
        if token.kind == "name":
            self.parsed.names.add(token.text)
            return token.text
        if token.kind == "ident":
            if token.text.upper() in RESERVED:
                raise self.fail(
                    f"Attribute name is a reserved keyword; reserved keyword: {token.text}"
                )
            return token.text
        raise self.syntax(1)

    def value(self) -> str:
        token = self.next()
        if token.kind != "value":
            raise self.syntax(1)
        self.parsed.values.add(token.text)
        return token.text

    def operand(self) -> tuple[str, Any]:
        """("path", path) | ("value", ":v") | ("size", path)."""
        token = self.peek()
        if token.kind == "value":
            return ("value", self.value())
        if token.kind == "ident" and self.peek(1).text == "(":
            if token.text != "size":
                if token.text in CONDITION_FUNCTIONS:
                    raise self.syntax()
                raise self.fail(f"Invalid function name; function: {token.text}")
            self.at += 2
            path = self.path()
            self.expect(")")
            return ("size", path)
        return ("path", self.path())

    # -- conditions ------------------------------------------------------------------------

    def condition(self) -> Condition:
        left = self.conjunction()
        while self.keyword("OR"):
            left = _or(left, self.conjunction())
        return left

    def conjunction(self) -> Condition:
        left = self.negation()
        while self.keyword("AND"):
            left = _and(left, self.negation())
        return left

    def negation(self) -> Condition:
        if self.keyword("NOT"):
            inner = self.negation()
            return lambda item, names, values: not inner(item, names, values)
        return self.comparison()

    def comparison(self) -> Condition:
        if self.op("("):
            inner = self.condition()
            self.expect(")")
            return inner
        token = self.peek()
        if token.kind == "ident" and self.peek(1).text == "(" and token.text != "size":
            return self.function()
        left = self.operand()
        token = self.next()
        if token.kind == "op" and token.text in COMPARATORS:
            right = self.operand()
            if left[0] == "path" and left == right:
                raise self.fail(
                    "The first operand must be distinct from the remaining operands for this "
                    f"operator or function; operator: {token.text}, first operand: "
                    f"[{', '.join(map(str, left[1]))}]"
                )
            return _comparison(token.text, left, right)
        if token.kind == "ident" and token.text.upper() == "BETWEEN":
            low = self.operand()
            if not self.keyword("AND"):
                raise self.syntax()
            return _between(left, low, self.operand())
        if token.kind == "ident" and token.text.upper() == "IN":
            self.expect("(")
            options = [self.operand()]
            while self.op(","):
                options.append(self.operand())
            self.expect(")")
            return _in(left, options)
        raise self.syntax(1)

    def function(self) -> Condition:
        name = self.next().text
        if name not in CONDITION_FUNCTIONS:
            raise self.fail(f"Invalid function name; function: {name}")
        self.expect("(")
        path = self.path()
        if name in ("attribute_exists", "attribute_not_exists"):
            self.expect(")")
            return _exists(path, name == "attribute_exists")
        self.expect(",")
        other = self.operand()
        self.expect(")")
        if name == "attribute_type":
            return _attribute_type(path, other, self.kind)
        if name == "begins_with":
            return _begins_with(path, other, self.kind)
        return _contains(path, other)


# -- evaluation ------------------------------------------------------------------------------------


def resolve(path: Path, names: Names) -> Resolved:
    return tuple([names[p] if type(p) is str and p[0] == "#" else p for p in path])


def get_path(item: Item | None, path: Resolved) -> Value | None:
    """The value at ``path`` (resolved), or None."""
    if item is None:
        return None
    value: Value | None = item.get(cast(str, path[0]))
    for part in path[1:]:
        if value is None:
            return None
        if isinstance(part, int):
            items = value.get("L")
            value = items[part] if items is not None and part < len(items) else None
        else:
            members = value.get("M")
            value = members.get(part) if members is not None else None
    return value


Getter = Callable[[Item | None, Names], Value | None]


def getter(path: Path) -> Getter:
    """A fast reader of the value at ``path`` (its placeholders resolved at each call)."""
    first = path[0]
    if len(path) == 1:
        if isinstance(first, str) and first[0] == "#":
            return lambda item, names: None if item is None else item.get(names[first])
        name = cast(str, first)
        return lambda item, names: None if item is None else item.get(name)
    parts = [(p, isinstance(p, str) and p[0] == "#") for p in path[1:]]
    head = cast(str, first)
    named = head[0] == "#"

    def get(item: Item | None, names: Names) -> Value | None:
        if item is None:
            return None
        value = item.get(names[head] if named else head)
        for part, placeholder in parts:
            if value is None:
                return None
            if type(part) is int:
                items = value.get("L")
                value = items[part] if items is not None and part < len(items) else None
            else:
                members = value.get("M")
                key = names[cast(str, part)] if placeholder else cast(str, part)
                value = members.get(key) if members is not None else None
        return value

    return get


def operand_of(node: tuple[str, Any]) -> Operand:
    kind, what = node
    if kind == "value":
        return lambda item, names, values: values[what]
    get = getter(what)
    if kind == "size":
        return lambda item, names, values: _size(get(item, names))
    return lambda item, names, values: get(item, names)


def _size(value: Value | None) -> Value | None:
    if value is None:
        return None
    ((kind, raw),) = value.items()
    if kind in ("N", "BOOL", "NULL"):
        return None
    return {"N": str(len(raw))}


def _or(a: Condition, b: Condition) -> Condition:
    return lambda item, names, values: a(item, names, values) or b(item, names, values)


def _and(a: Condition, b: Condition) -> Condition:
    return lambda item, names, values: a(item, names, values) and b(item, names, values)


def _comparison(op: str, left: tuple[str, Any], right: tuple[str, Any]) -> Condition:
    a, b = operand_of(left), operand_of(right)
    if op == "=":
        return lambda item, names, values: equal(a(item, names, values), b(item, names, values))
    if op == "<>":
        return lambda i, n, v: not equal(a(i, n, v), b(i, n, v))
    test: Callable[[int], bool] = {
        "<": lambda c: c < 0,
        "<=": lambda c: c <= 0,
        ">": lambda c: c > 0,
        ">=": lambda c: c >= 0,
    }[op]

    def ordered(item: Item | None, names: Names, values: Values) -> bool:
        c = compare(a(item, names, values), b(item, names, values))
        return c is not None and test(c)

    return ordered


def _between(x: tuple[str, Any], low: tuple[str, Any], high: tuple[str, Any]) -> Condition:
    a, lo, hi = operand_of(x), operand_of(low), operand_of(high)

    def between(item: Item | None, names: Names, values: Values) -> bool:
        bottom, top = lo(item, names, values), hi(item, names, values)
        if low[0] == high[0] == "value" and (compare(bottom, top) or 0) > 0:
            raise Invalid(
                "Invalid ConditionExpression: The BETWEEN operator requires upper bound to be "
                "greater than or equal to lower bound; lower bound operand: AttributeValue: "
                f"{_shown(bottom)}, upper bound operand: AttributeValue: {_shown(top)}"
            )
        value = a(item, names, values)
        c1, c2 = compare(value, bottom), compare(value, top)
        return c1 is not None and c2 is not None and c1 >= 0 and c2 <= 0

    return between


def _shown(value: Value | None) -> str:
    if value is None:
        return "{}"
    ((kind, raw),) = value.items()
    return f"{{{kind}:{raw}}}"


def _in(x: tuple[str, Any], options: list[tuple[str, Any]]) -> Condition:
    a, choices = operand_of(x), [operand_of(o) for o in options]

    def within(item: Item | None, names: Names, values: Values) -> bool:
        value = a(item, names, values)
        return value is not None and any(equal(value, c(item, names, values)) for c in choices)

    return within


def _exists(path: Path, wanted: bool) -> Condition:
    get = getter(path)
    return lambda item, names, values: (get(item, names) is not None) == wanted


def _attribute_type(path: Path, other: tuple[str, Any], kind: str) -> Condition:
    of, get = operand_of(other), getter(path)

    def typed(item: Item | None, names: Names, values: Values) -> bool:
        wanted = of(item, names, values)
        name = None if wanted is None else wanted.get("S")
        if name not in TYPE_NAMES:
            raise Invalid(
                f"Invalid {kind}: Invalid attribute type name found; type: {name}, valid types: "
                "{N,BS,L,B,NULL,M,S,SS,NS,BOOL}"
            )
        value = get(item, names)
        return value is not None and kind_of(value) == name

    return typed


def _begins_with(path: Path, other: tuple[str, Any], kind: str) -> Condition:
    of, get = operand_of(other), getter(path)

    def begins(item: Item | None, names: Names, values: Values) -> bool:
        prefix = of(item, names, values)
        if prefix is not None and other[0] == "value" and kind_of(prefix) not in ("S", "B"):
            raise Invalid(
                f"Invalid {kind}: Incorrect operand type for operator or function; operator or "
                f"function: begins_with, operand type: {kind_of(prefix)}"
            )
        value = get(item, names)
        if value is None or prefix is None or kind_of(value) != kind_of(prefix):
            return False
        return bool(next(iter(value.values())).startswith(next(iter(prefix.values()))))

    return begins


def _contains(path: Path, other: tuple[str, Any]) -> Condition:
    of, get = operand_of(other), getter(path)

    def contains(item: Item | None, names: Names, values: Values) -> bool:
        value, member = get(item, names), of(item, names, values)
        if value is None or member is None:
            return False
        ((kind, raw),) = value.items()
        ((mkind, mraw),) = member.items()
        if kind in ("S", "B"):
            return mkind == kind and mraw in raw
        if kind in SETS:
            return mkind == SETS[kind] and mraw in raw
        if kind == "L":
            return any(equal(x, member) for x in raw)
        return False

    return contains


# -- updates ---------------------------------------------------------------------------------------

SetValue = Callable[[Item | None, Names, Values], Value]


@dataclass
class Update:
    """A parsed UpdateExpression: its SET targets and values, REMOVE paths, ADD and DELETE
    paths with their value placeholders."""

    sets: list[tuple[Path, SetValue]] = field(default_factory=list)
    removes: list[Path] = field(default_factory=list)
    adds: list[tuple[Path, str]] = field(default_factory=list)
    deletes: list[tuple[Path, str]] = field(default_factory=list)

    def paths(self) -> Iterator[Path]:
        yield from (p for p, _ in self.sets)
        yield from self.removes
        yield from (p for p, _ in self.adds)
        yield from (p for p, _ in self.deletes)


class UpdateParser(Parser):
    def update(self) -> Update:
        update, seen = Update(), set()
        while self.peek().kind != "eof":
            token = self.next()
            word = token.text.upper() if token.kind == "ident" else ""
            if word not in ("SET", "REMOVE", "ADD", "DELETE"):
                raise self.syntax(1)
            if word in seen:
                raise self.fail(
                    f'The "{word}" section can only be used once in an update expression;'
                )
            seen.add(word)
            while True:
                self.action(word, update)
                if not self.op(","):
                    break
        return update

    def action(self, word: str, update: Update) -> None:
        path = self.path()
        if word == "SET":
            self.expect("=")
            update.sets.append((path, self.set_value()))
        elif word == "REMOVE":
            update.removes.append(path)
        else:
            placeholder = self.value()
            (update.adds if word == "ADD" else update.deletes).append((path, placeholder))

    def set_value(self) -> SetValue:
        left = self.set_operand()
        for sign, text in ((1, "+"), (-1, "-")):
            if self.op(text):
                return _plus(left, self.set_operand(), sign, text)
        return left

    def set_operand(self) -> SetValue:
        token = self.peek()
        if token.kind == "ident" and self.peek(1).text == "(":
            self.at += 2
            if token.text == "if_not_exists":
                path = self.path()
                self.expect(",")
                default = self.set_value()
                self.expect(")")
                return _if_not_exists(path, default)
            if token.text == "list_append":
                first = self.set_value()
                self.expect(",")
                second = self.set_value()
                self.expect(")")
                return _list_append(first, second)
            raise self.fail(f"Invalid function name; function: {token.text}")
        node = self.operand() if token.kind != "ident" or token.text != "size" else None
        if node is None or node[0] == "size":
            raise self.syntax()
        return _required(operand_of(node))


def _required(of: Operand) -> SetValue:
    def value(item: Item | None, names: Names, values: Values) -> Value:
        found = of(item, names, values)
        if found is None:
            raise Invalid(
                "The provided expression refers to an attribute that does not exist in the item"
            )
        return found

    return value


def _plus(a: SetValue, b: SetValue, sign: int, op: str) -> SetValue:
    def plus(item: Item | None, names: Names, values: Values) -> Value:
        left, right = a(item, names, values), b(item, names, values)
        for side in (left, right):
            if kind_of(side) != "N":
                raise Invalid(
                    "Invalid UpdateExpression: Incorrect operand type for operator or function; "
                    f"operator or function: {op}, operand type: {kind_of(side)}"
                )
        return {"N": arithmetic(left["N"], right["N"], sign)}

    return plus


def _if_not_exists(path: Path, default: SetValue) -> SetValue:
    get = getter(path)

    def value(item: Item | None, names: Names, values: Values) -> Value:
        found = get(item, names)
        return found if found is not None else default(item, names, values)

    return value


def _list_append(a: SetValue, b: SetValue) -> SetValue:
    def value(item: Item | None, names: Names, values: Values) -> Value:
        first, second = a(item, names, values), b(item, names, values)
        if kind_of(first) != "L" or kind_of(second) != "L":
            raise Invalid("An operand in the update expression has an incorrect data type")
        return {"L": first["L"] + second["L"]}

    return value


# -- the cache -------------------------------------------------------------------------------------

_cache: dict[tuple[str, str], Parsed | Invalid] = {}


def parse(text: str, kind: str) -> Parsed:
    """``text`` parsed as an expression of ``kind`` ("ConditionExpression", "UpdateExpression",
    "KeyConditionExpression", "FilterExpression", "ProjectionExpression"), once per text."""
    known = _cache.get((kind, text))
    if known is None:
        try:
            known = _parse(text, kind)
        except Invalid as exc:
            known = exc
        if len(_cache) > 50_000:
            _cache.clear()
        _cache[(kind, text)] = known
    if isinstance(known, Invalid):
        raise known
    return known


def _parse(text: str, kind: str) -> Parsed:
    if not text.strip():
        raise Invalid(f"Invalid {kind}: The expression can not be empty;")
    if kind == "UpdateExpression":
        parser: Parser = UpdateParser(text, kind)
        assert isinstance(parser, UpdateParser)
        parser.parsed.update = parser.update()
    else:
        parser = Parser(text, kind)
        if kind == "ProjectionExpression":
            parser.parsed.paths.append(parser.path())
            while parser.op(","):
                parser.parsed.paths.append(parser.path())
        elif kind == "KeyConditionExpression":
            parser.parsed.keys = key_parts(parser)
        else:
            parser.parsed.condition = parser.condition()
    parser.end()
    return parser.parsed


def key_parts(parser: Parser) -> list[tuple[str, Path, tuple[str, ...]]]:
    """A KeyConditionExpression's conditions, each (operator, the key's path, its value
    placeholders): ``=``, ``<``..., ``BETWEEN`` (two values) or ``begins_with``, joined by AND."""
    parts = [key_part(parser)]
    while True:
        token = parser.peek()
        if parser.keyword("AND"):
            parts.append(key_part(parser))
        elif token.kind == "ident" and token.text.upper() in ("OR", "NOT"):
            raise Invalid(f"Invalid operator used in KeyConditionExpression: {token.text.upper()}")
        else:
            return parts


def key_part(parser: Parser) -> tuple[str, Path, tuple[str, ...]]:
    if parser.op("("):
        part = key_part(parser)
        parser.expect(")")
        return part
    if parser.peek().kind == "ident" and parser.peek().text == "begins_with":
        parser.at += 1
        parser.expect("(")
        path = parser.path()
        parser.expect(",")
        prefix = parser.value()
        parser.expect(")")
        return ("begins_with", path, (prefix,))
    path = parser.path()
    token = parser.next()
    if token.kind == "op" and token.text in COMPARATORS - {"<>"}:
        return (token.text, path, (parser.value(),))
    if token.kind == "ident" and token.text.upper() == "BETWEEN":
        low = parser.value()
        if not parser.keyword("AND"):
            raise parser.syntax()
        return ("BETWEEN", path, (low, parser.value()))
    if token.text.upper() in ("OR", "NOT", "IN") or token.text == "<>":
        raise Invalid(f"Invalid operator used in KeyConditionExpression: {token.text.upper()}")
    raise parser.syntax(1)
