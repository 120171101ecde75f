"""Errors a user can fix. The CLI prints them without a traceback and exits with status 2."""

from __future__ import annotations

import difflib


#: the install hint of commands that need the measuring libraries (the CLI escapes rich markup itself)
MEASURE_EXTRA = 'pip install -e ".[measure]"  (torch, transformers, peft, bitsandbytes)'


class UserError(Exception):
    """Bad input: names the file/line/key when known, and what to write instead."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


def unknown_name(kind: str, name: str, known: list[str]) -> UserError:
    """An error for an unknown catalog name that lists the close names (or all of them)."""
    close = difflib.get_close_matches(name, known, n=4, cutoff=0.4)
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    else:
        hint = "known: " + ", ".join(known)
    return UserError(f"unknown {kind} {name!r}", hint=hint)
