"""What reaches a terminal: the one sanitiser for every text pswift prints.

A job name, a work directory, a crash's message, a log line, a history row: any of them is
text a user chose, and a control character in it (ESC starts a terminal escape; C1's CSI,
U+009B, is one on its own) would drive the terminal of whoever reads it, root included.

- :func:`inert` makes one string safe (each control character a ``?``);
- :func:`guard` puts a filter in front of ``sys.stdout`` and ``sys.stderr`` once, when the
  command starts (cli/main.py's ``main``), so that nothing reaches either unfiltered, whatever
  path it took (click, print, rich, a warning), JSON and a pipe included: a class, not a shape;
- :func:`raw_stdout` is the stream behind the filter, for what pswift draws itself (rich's
  progress bar) and for ``pswift logs --raw``, which the user asks for by name.

JSON stays valid: a control character can only stand inside a JSON string, where
:func:`json_inert` writes it as its ``\\uXXXX`` escape (the same text, read back).
"""

from __future__ import annotations

import io
import re
import sys
from typing import Any, TextIO

#: a control character (C0, DEL, C1): a terminal escape starts with one
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def inert(text: str, lines: bool = False) -> str:
    """Text a user wrote (a job name, a crash's message, a log), safe to print: its control
    characters, terminal escapes among them, each a ``?`` (``lines``: newlines and tabs kept)."""
    return (_CONTROL_BUT_LINES if lines else CONTROL).sub("?", text)


def json_inert(text: str) -> str:
    """JSON text with every control character that JSON allows raw (DEL, C1) written as its
    ``\\uXXXX`` escape: the same value to a JSON reader, nothing to a terminal."""
    return _CONTROL_BUT_LINES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class InertStream(io.TextIOBase):
    """A text stream that writes through to ``raw`` with every control character but newline
    and tab made a ``?``. It has no ``buffer``: nothing (click included) can write around it."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(_CONTROL_BUT_LINES.sub("?", text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.raw, "encoding", None) or "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)


def guard() -> None:
    """Filter ``sys.stdout`` and ``sys.stderr`` for the rest of the process (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, InertStream):
            setattr(sys, name, InertStream(stream))


def raw_stdout() -> Any:
    """The stream behind the filter (``sys.stdout`` itself where :func:`guard` did not run)."""
    return sys.stdout.raw if isinstance(sys.stdout, InertStream) else sys.stdout


def raw_stderr() -> Any:
    return sys.stderr.raw if isinstance(sys.stderr, InertStream) else sys.stderr
