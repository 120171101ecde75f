"""Reading a YAML file a user wrote (a sweep file, a TRL or Axolotl config) without a traceback and
without letting it take the machine: every error names the file and the line.

Limits (README, "Limits"): at most ``MAX_FILE_BYTES``; at most ``MAX_YAML_NODES`` values once its
aliases are expanded (a "billion laughs" file is refused from its node tree, before anything is
constructed); at most ``MAX_DEPTH`` levels of nesting (deeper, PyYAML's recursive composer and
constructor would raise ``RecursionError``); UTF-8 text; no recursive alias; no key written twice in
one mapping (YAML keeps the last one without a word).

Parsed by PyYAML's pure-Python ``SafeLoader``, never libyaml's C loader (``CSafeLoader``, which the
catalog uses for its own ``gpus.yaml``): the C loader composes nested values by C recursion with no
depth check, and a line of 100,000 ``[`` killed Python 3.11 with PyYAML 6.0 by a segmentation fault
(5,000 composed), where the pure-Python composer raises ``RecursionError``, reported here as an error.
Torch-free and dependency-free beyond PyYAML (the calculator runs it under Pyodide).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from reportgen import userfile
from reportgen.errors import UserError

#: the largest file read (bytes)
MAX_FILE_BYTES = 1_000_000
#: the most values (scalars, lists, mappings) a file may hold with its aliases expanded
MAX_YAML_NODES = 100_000
#: the deepest nesting of lists and mappings
MAX_DEPTH = 32

@dataclass(frozen=True)
class Kind:
    """What the file is, in a user's words, for the errors: ``noun`` ("sweep file"), ``what_it_holds``
    (the hint beside a size error), ``example`` (where to look when the file is missing),
    ``repeated_key`` (the hint beside a duplicate key: what the writer may have meant)."""

    noun: str
    what_it_holds: str
    example: str
    repeated_key: str = "write each key once"


def read_text(path: Path, kind: Kind) -> str:
    """The file as text; a ``UserError`` naming it when it is missing, a directory, too large,
    unreadable or not UTF-8 (with the line of the first bad byte)."""
    try:
        data = userfile.read_bytes(path, MAX_FILE_BYTES)
    except userfile.TooLarge as exc:
        raise UserError(f"{path}: {exc.amount()}; a {kind.noun} is at most {MAX_FILE_BYTES:,} bytes",
                        hint=kind.what_it_holds) from None
    except FileNotFoundError:
        raise UserError(f"{path}: no such {kind.noun}", hint=kind.example) from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a {kind.noun}", hint=kind.example) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start})",
                        hint=f"save the {kind.noun} as UTF-8") from None


def check_nodes(path: Path, root: yaml.Node, kind: Kind) -> None:
    """Refuse duplicate keys, recursive aliases, too deep nesting and too many values once aliases
    are expanded, walking each node once (sizes of shared nodes are memoized)."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        line = node.start_mark.line + 1
        if key in busy:
            raise UserError(f"{path}:{line}: an alias refers to the node that contains it (a recursive value)",
                            hint=f"a {kind.noun} is a tree: write the value out instead of *alias")
        if depth > MAX_DEPTH:
            raise UserError(f"{path}:{line}: nested more than {MAX_DEPTH} levels deep")
        busy.add(key)
        n = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in seen:
                        raise UserError(f"{path}:{k.start_mark.line + 1}: duplicate key {k.value!r} (first at line "
                                        f"{seen[k.value]}); YAML would keep only the last one",
                                        hint=kind.repeated_key)
                    seen[k.value] = k.start_mark.line + 1
                n += size(k, depth + 1) + size(v, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            n += sum(size(item, depth + 1) for item in node.value)
        busy.discard(key)
        sizes[key] = n
        if n > MAX_YAML_NODES:
            raise UserError(f"{path}:{line}: more than {MAX_YAML_NODES:,} values once its aliases are expanded",
                            hint=kind.what_it_holds)
        return n

    size(root, 0)


def load(path: Path, kind: Kind) -> tuple[yaml.Node | None, object]:
    """``read_text`` then ``parse``: the file's node tree and data, within every limit."""
    return parse(path, read_text(path, kind), kind)


def parse(path: Path, text: str, kind: Kind) -> tuple[yaml.Node | None, object]:
    """The composed node tree (for line numbers) and the constructed data, checked by
    ``check_nodes`` before anything is constructed; ``(None, None)`` for an empty file."""
    try:
        loader = yaml.SafeLoader(text)  # checks every character first: a control character is a ReaderError
    except yaml.reader.ReaderError as exc:
        raise UserError(f"{path}:{text.count(chr(10), 0, exc.position) + 1}: not valid YAML (the character "
                        f"U+{exc.character:04X} is not allowed in YAML)") from None
    try:
        node = loader.get_single_node()
        if node is not None:
            check_nodes(path, node, kind)
        return node, (loader.construct_document(node) if node is not None else None)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise UserError(f"{path}:{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer of more than 4300 digits
        raise UserError(f"{path}: a value cannot be read ({exc})") from None
    finally:
        loader.dispose()
