"""Lines of library code, as issue 41 counts them: lines of ``dynasem/`` that hold a code
token (comments, docstrings and blank lines are not counted; migrations are left out).

    python3 scripts/count_lines.py [dynasem] [-v]

``-v`` lists every file, largest first. (It gives 10,952 at b3cc540, the issue's figure.)
"""

from __future__ import annotations

import io
import sys
import tokenize
from pathlib import Path

SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold a token other than a comment or a docstring."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines: set[int] = set()
    for i, token in enumerate(tokens):
        if token.type in SKIPPED or _is_docstring(tokens, i):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def _is_docstring(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    """A string that is a statement of its own (first in its block or after a statement)."""
    if tokens[i].type != tokenize.STRING:
        return False
    quiet = (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    before = [t for t in tokens[:i] if t.type not in quiet]
    after = tokens[i + 1] if i + 1 < len(tokens) else None
    starts = not before or before[-1].type == tokenize.NEWLINE or before[-1].string == ":"
    ends = after is not None and after.type in (tokenize.NEWLINE, tokenize.ENDMARKER)
    return starts and ends


def main(argv: list[str]) -> None:
    args = [a for a in argv if a != "-v"]
    root = Path(args[0] if args else "dynasem")
    rows = [
        (code_lines(path.read_text(encoding="utf-8")), str(path))
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.parts
    ]
    if "-v" in argv:
        for count, path in sorted(rows, reverse=True):
            print(count, path)
    print("total", sum(count for count, _ in rows))


if __name__ == "__main__":
    main(sys.argv[1:])
