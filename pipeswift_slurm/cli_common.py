"""Helpers shared by the CLI modules: one-line errors with the library's exit codes, warnings."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from .errors import PswiftError


class CLIError(click.ClickException):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map library exceptions to one-line click errors with the library's exit code."""
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except PswiftError as e:
            raise CLIError(str(e), e.exit_code) from None
        except Exception as e:  # a query outside History's guarded methods (reports)
            if type(e).__module__ != "sqlite3":
                raise
            raise CLIError(f"history database: {e}; if it is corrupt, move it aside and run "
                           f"`pswift history ingest` to rebuild it", 1) from None
    return wrapper


def _warn(msg: str) -> None:
    click.echo(msg, err=True)
