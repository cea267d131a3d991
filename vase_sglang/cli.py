"""Shared pieces of the command-line tools (benchmarks, eval): one-line errors, typed values,
JSON Lines input files."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from typing import Any


class OneLineParser(argparse.ArgumentParser):
    """Reports a bad option in one line (``PROG: error: ... (see --help)``), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


class JSONLineError(ValueError):
    """A line of a JSON Lines file that is not JSON: its number (from 1) and json's message."""

    def __init__(self, line: int, msg: str) -> None:
        super().__init__(f"line {line}: not JSON ({msg})")
        self.line = line
        self.msg = msg


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` for each non-blank line of a JSON Lines file, numbered from 1;
    a line that is not JSON raises ``JSONLineError``."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JSONLineError(n, exc.msg) from None
        yield n, value
