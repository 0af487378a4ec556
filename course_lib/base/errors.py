"""The course's own errors: bad input or setup, raised where it is found, with the remedy in the message. The CLI
prints a CourseError as its message alone; every other exception keeps its traceback (a bug or a library's error).

One type to catch, CourseError. Where a problem's kind was already part of the API (a missing path, a file in a
folder's place, a failed download), the raise uses a subclass that is also that builtin type, so callers that catch
FileNotFoundError, NotADirectoryError or RuntimeError keep working."""
from __future__ import annotations


class CourseError(ValueError):
    """Bad input or setup found by the course; its message names the remedy (a ValueError for older callers)."""


class MissingPathError(CourseError, FileNotFoundError):
    """A course error about a path that does not exist."""


class NotAFolderError(CourseError, NotADirectoryError):
    """A course error about a file standing where a folder should be."""


class SetupError(CourseError, RuntimeError):
    """A course error about the environment (a failed download, a GPU that torch cannot use)."""


class WriteError(CourseError, OSError):
    """A course error about an output that could not be written (a full disk, a folder it may not write to)."""


class DivergedError(CourseError, ArithmeticError):
    """A course error about a training run whose loss stopped being finite (a learning rate too high)."""
