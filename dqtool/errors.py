"""Exceptions that mean "the user's input is wrong", as opposed to bugs.

The CLI turns every ``DqtoolError`` into one line on stderr and its ``exit_code``;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DqtoolError(Exception):
    """A problem with the user's input or request; never a bug in dqtool."""

    exit_code = 2


class InputError(DqtoolError):
    """The model (or another input file) cannot be read: missing, truncated, unsafe, …"""


class UsageError(DqtoolError):
    """Options that do not fit together or name something unknown."""


class OutputError(DqtoolError, OSError):
    """The output cannot be written (disk full, permissions …); nothing was written. Also an
    ``OSError``, as the failure it reports."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno N]"
        return self.strerror or super().__str__()


class RefusedError(DqtoolError):
    """A conversion or fold that would not be exact, or that cannot be expressed."""

    exit_code = 1


class KernelError(ValueError):
    """Arguments to the dequantization kernel break a rule of the operator.

    A ``ValueError`` so that NumPy-style callers can catch it as such; the message names
    the rule broken and the shapes involved.
    """
