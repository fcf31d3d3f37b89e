"""Files named on the ``scanweaver`` command line: the recurrence and JSON files it reads and
the outputs it writes.

Whatever a path names (nothing, a directory, a FIFO, a device, a huge or binary file), reading
or writing it ends in a :class:`CliError` that names the argument; nothing is opened that could
block.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from explorer.cli.errors import CliError

#: largest recurrence file read, and largest bench JSON file read by ``report``
RECURRENCE_LIMIT = 1024 * 1024
RESULTS_LIMIT = 256 * 1024 * 1024


def _read_text(path: str, what: str, limit: int) -> str:
    """The UTF-8 text of the regular file ``path`` (at most ``limit`` bytes)."""
    from explorer.files import UnsafeFile, read_regular

    try:
        data = read_regular(path, limit)
    except FileNotFoundError:
        raise CliError(f"{what} {path}: no such file") from None
    except UnsafeFile as err:     # a directory, FIFO, device or oversized file
        raise CliError(f"{what}: {err}") from None
    except OSError as err:
        raise CliError(f"{what} {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"{what} {path}: not UTF-8 text (byte {err.start} is "
                       f"{data[err.start]:#04x})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_output(path: str, what: str, directory: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written: an existing thing of
    the wrong kind (a FIFO or device is never opened), or a parent that is not a directory."""
    try:
        mode: int | None = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None   # then a parent is missing (made when writing) or is not a directory
    except OSError as err:   # a loop of links, a name too long, ...
        raise CliError(f"{what} {path}: {err.strerror or err}") from None
    if mode is not None:
        wanted = stat.S_ISDIR if directory else stat.S_ISREG
        if not wanted(mode):
            raise CliError(f"{what} {path}: is {_kind(mode)}, not "
                           f"{'a directory' if directory else 'a file'}")
        return
    parent = Path(os.path.abspath(path)).parent
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"{what} {path}: {parent} is not a directory")


def _write_text(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def _read_recurrence(text: str) -> str:
    """The recurrence argument: '-' (stdin), an existing file, or the text itself."""
    if text == "-":
        data = sys.stdin.buffer.read(RECURRENCE_LIMIT + 1)
        if len(data) > RECURRENCE_LIMIT:
            raise CliError(f"recurrence on stdin: more than {RECURRENCE_LIMIT} bytes")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CliError(f"recurrence on stdin: not UTF-8 text (byte {err.start})") from None
    if os.path.lexists(text):
        return _read_text(text, "recurrence file", RECURRENCE_LIMIT)
    if "=" not in text:
        raise CliError(f"recurrence {text!r}: no such file, and not a recurrence (one has '=', "
                       "e.g. 'h[t] = a[t] * h[t-1] + b[t]')")
    return text
