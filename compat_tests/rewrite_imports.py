"""The ``import`` mode's rewrite: an example's ``ray`` imports made to import miniray.

Owns one pure function, ``rewrite_ray_imports``, and its helpers. Does not run anything.
conftest.py loads this file by path and calls it for each ``import``-mode run;
test_doc_examples.py tests it through the ``ray_import_rewriter`` fixture.
"""

from __future__ import annotations

import ast
import io
import tokenize


def _char_col(line: str, byte_col: int) -> int:
    """ast gives columns in UTF-8 bytes; tokenize gives them in characters."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))


def _is_ray(dotted: str | None) -> bool:
    return dotted is not None and dotted.split(".")[0] == "ray"


def rewrite_ray_imports(source: str) -> tuple:
    """Rewrite the real import statements of ``ray`` to import miniray instead.

    Returns ``(new_source, changes)``, ``changes`` being one readable line per edited line.
    Only statements the parser sees are touched (at any indentation, inside functions, after
    ``;``); comments and strings keep their text, and line numbers are unchanged:

    * ``import ray`` -> ``import miniray as ray``; ``import ray as r`` -> ``import miniray as r``
    * ``import ray.util.x`` -> ``import miniray.util.x; import miniray as ray`` (it binds ``ray``)
    * ``from ray.x import y`` / ``from ray import y`` -> ``from miniray.x import y`` / ...

    Relative imports and ``rayx``-like names are left alone. A file that does not parse is
    returned unchanged, so running it shows the SyntaxError.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return source, [f"not rewritten: the file does not parse ({error})"]
    lines = io.StringIO(source).readlines()
    starts = {}
    for node in ast.walk(tree):
        wanted = (isinstance(node, ast.Import) and any(_is_ray(a.name) for a in node.names)) or (
            isinstance(node, ast.ImportFrom) and node.level == 0 and _is_ray(node.module)
        )
        if wanted:
            col = _char_col(lines[node.lineno - 1], node.col_offset)
            starts[(node.lineno, col)] = node
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT}
    edits = []  # (row, start_col, end_col, replacement), all on one line each
    for index, tok in enumerate(tokens):
        node = starts.get(tok.start)
        if node is None or tok.type != tokenize.NAME:
            continue
        end = (node.end_lineno, _char_col(lines[node.end_lineno - 1], node.end_col_offset))
        body = []
        for later in tokens[index + 1 :]:
            if later.start >= end:
                break
            if later.type not in skip:
                body.append(later)
        if isinstance(node, ast.ImportFrom):
            first = body[0]  # the first name of the dotted module: "ray"
            edits.append((first.start[0], first.start[1], first.end[1], "miniray"))
            continue
        needs_alias = False
        for parts, asname in _import_aliases(body):
            head = parts[0]
            if head.string != "ray":
                continue
            if asname is None and len(parts) == 1:
                replacement = "miniray as ray"
            else:
                replacement = "miniray"
                needs_alias = needs_alias or asname is None
            edits.append((head.start[0], head.start[1], head.end[1], replacement))
        if needs_alias:
            edits.append((end[0], end[1], end[1], "; import miniray as ray"))
    original = list(lines)
    for row, start, stop, text in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:start] + text + line[stop:]
    changes = [
        f"line {row}: {original[row - 1].strip()!r} -> {lines[row - 1].strip()!r}"
        for row in sorted({edit[0] for edit in edits})
    ]
    return "".join(lines), changes


def _import_aliases(body: list) -> list:
    """Split the tokens after ``import`` into ([name tokens], as-name token or None)."""
    aliases = []
    parts, asname, seen_as = [], None, False
    for tok in body:
        if tok.type == tokenize.OP and tok.string == ",":
            aliases.append((parts, asname))
            parts, asname, seen_as = [], None, False
        elif tok.type == tokenize.NAME and tok.string == "as":
            seen_as = True
        elif tok.type == tokenize.NAME:
            if seen_as:
                asname = tok
            else:
                parts.append(tok)
    if parts:
        aliases.append((parts, asname))
    return aliases
