"""Subcommands of this package (see ``reportgen.cli.PLUGINS``)."""

from __future__ import annotations


def register(sub) -> None:
    """Add this package's subcommands to the ``reportgen`` parser."""
