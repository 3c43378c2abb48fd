"""Errors of the local CEL environment, worded like the Kubernetes ones where they exist."""

from __future__ import annotations

from celpy.evaluation import CELEvalError


class CelCompileError(ValueError):
    """The expression is rejected before any device is looked at (what the apiserver refuses).

    ``unsupported`` marks expressions that Kubernetes accepts but this local evaluator
    cannot run (a library it does not implement): not the author's fault.
    """

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        column: int | None = None,
        unsupported: bool = False,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.unsupported = unsupported
        self.hint = hint
        """How to write it instead, when that is clear (not part of the apiserver's words)."""

    def __str__(self) -> str:
        if self.line is None:
            return self.message
        return f"{self.message} (line {self.line}, column {self.column})"


class CelEvalError(RuntimeError):
    """A runtime error while evaluating one device: the scheduler aborts allocation on it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def cel_error(message: str) -> CELEvalError:
    """An error *value* for celpy: it propagates, and ``&&``/``||`` can absorb it."""
    return CELEvalError(message)
