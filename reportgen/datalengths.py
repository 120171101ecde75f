"""A dataset's sample lengths from a file (``--lengths FILE``): token counts, as a list or a histogram.

Accepted, one format per file:

* a text file, one sample per line: ``1532`` (a token count), or a histogram line ``1532 7`` /
  ``1532,7`` (a length and how many samples have it); ``#`` starts a comment;
* JSON: a list of token counts ``[1532, 880, ...]``, or an object ``{"1532": 7, "880": 2}``.

The docs give the one-line script that writes such a file from a dataset with its tokenizer. Every
value is a whole number: a length from 1 to ``MAX_LENGTH`` tokens, a count from 1 up. A bad value is
an error naming the file and line. Torch-free (layer 0), like the rest of what reads a user's file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from reportgen.errors import UserError
from reportgen.userfile import TooLarge, read_bytes

#: the longest sample accepted: past any model's context (the catalog's longest is 131,072 tokens)
MAX_LENGTH = 16_777_216
#: the largest file read (a list of 10 million lengths as text is about 50 MB)
MAX_FILE_BYTES = 64 * 2**20
HINT = "one token count per line (or 'LENGTH COUNT'), or JSON: [1532, 880] / {\"1532\": 7}"


@dataclass(frozen=True)
class Lengths:
    """Sample lengths as a histogram: ``values`` ascending, ``counts`` the samples of each."""

    values: tuple[int, ...]
    counts: tuple[int, ...]
    source: str = ""

    @property
    def n(self) -> int:
        return sum(self.counts)

    @property
    def longest(self) -> int:
        return self.values[-1]

    def mean(self, cap: int | None = None) -> float:
        """Mean length after truncation to ``cap`` tokens (None: none)."""
        cap = cap or self.longest
        return sum(min(v, cap) * c for v, c in zip(self.values, self.counts)) / self.n

    def share_over(self, cap: int) -> float:
        """Share of samples longer than ``cap`` (cut by truncation)."""
        return sum(c for v, c in zip(self.values, self.counts) if v > cap) / self.n

    def percentile(self, q: float) -> int:
        """The smallest length that at least ``q`` of the samples do not pass."""
        need, seen = q * self.n, 0
        for v, c in zip(self.values, self.counts):
            seen += c
            if seen >= need:
                return v
        return self.longest


def _value(text: str, where: str, what: str, high: int) -> int:
    try:
        number = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {text!r} is not a number", hint=HINT) from None
    if number != number or number in (float("inf"), float("-inf")) or number != int(number):
        raise UserError(f"{where}: {text!r} is not a whole number of {what}", hint=HINT)
    if not 1 <= number <= high:
        raise UserError(f"{where}: {what} {text} is out of range (1 to {high:,})", hint=HINT)
    return int(number)


def _from_pairs(pairs: list[tuple[str, str, str]], source: str) -> Lengths:
    """``(where, length text, count text)`` triples as a histogram."""
    hist: dict[int, int] = {}
    for where, length, count in pairs:
        v = _value(length, where, "tokens", MAX_LENGTH)
        hist[v] = hist.get(v, 0) + _value(count, where, "samples", 10**12)
    if not hist:
        raise UserError(f"{source}: no sample lengths in the file", hint=HINT)
    values = tuple(sorted(hist))
    return Lengths(values, tuple(hist[v] for v in values), source)


def _json_pairs(doc, source: str) -> list[tuple[str, str, str]]:
    if isinstance(doc, list):
        return [(f"{source}: item {i + 1}", x if isinstance(x, str) else json.dumps(x), "1") for i, x in enumerate(doc)]
    if isinstance(doc, dict):
        return [(f"{source}: key {k!r}", k, v if isinstance(v, str) else json.dumps(v)) for k, v in doc.items()]
    raise UserError(f"{source}: JSON {type(doc).__name__}, expected a list of token counts or a histogram object",
                    hint=HINT)


def _text_pairs(text: str, source: str) -> list[tuple[str, str, str]]:
    pairs = []
    for i, line in enumerate(text.splitlines(), 1):
        fields = [f for f in re.split(r"[\s,;]+", line.split("#", 1)[0].strip()) if f]
        if not fields:
            continue
        if len(fields) > 2:
            raise UserError(f"{source}:{i}: {line.strip()!r} has {len(fields)} values", hint=HINT)
        pairs.append((f"{source}:{i}", fields[0], fields[1] if len(fields) == 2 else "1"))
    return pairs


def read_lengths(path: str | Path) -> Lengths:
    """The file's lengths (the module's formats); a ``UserError`` naming the file and line otherwise."""
    path = Path(path)
    try:
        data = read_bytes(path, MAX_FILE_BYTES)
    except TooLarge as exc:
        raise UserError(f"{path}: {exc.amount()}, more than the {MAX_FILE_BYTES // 2**20} MiB a lengths file may have",
                        hint="write a histogram instead: one 'LENGTH COUNT' line per length") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the lengths file ({exc.strerror or exc})", hint=HINT) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text", hint=HINT) from None
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise UserError(f"{path}: not valid JSON ({exc})", hint=HINT) from None
        return _from_pairs(_json_pairs(doc, str(path)), str(path))
    return _from_pairs(_text_pairs(text, str(path)), str(path))
