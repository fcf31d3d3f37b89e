"""Reading files that come from elsewhere (records, caches, artifacts) without trusting them.

A path given by a user or found in a cache folder may be a FIFO (opening it for reading would
block forever), a device, a directory, a symbolic link planted to point elsewhere, or a file far
larger than anything the project writes. :func:`read_regular` opens without following a final
symbolic link and without blocking, checks that what it opened is a regular file, and reads at
most ``limit`` bytes; :func:`gunzip_limited` inflates gzip data with the same kind of bound, so a
small compressed file cannot expand into gigabytes.
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path


class UnsafeFile(ValueError):
    """The path is not a regular file of a reasonable size; the message says what it is."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular(path: str | os.PathLike[str], limit: int, follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises :class:`UnsafeFile` when ``path`` is not a regular file (FIFO, device, directory,
    or a symbolic link when ``follow_links`` is false) or is larger than ``limit``, and
    ``OSError`` when it cannot be opened. Never blocks on a FIFO.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise UnsafeFile(f"{path} is a symbolic link")
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if not follow_links and getattr(err, "errno", None) == 40:  # ELOOP: a link
            raise UnsafeFile(f"{path} is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):    # checked before fdopen, which refuses directories
        os.close(fd)
        raise UnsafeFile(f"{path} is {_kind(info.st_mode)}, not a file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            raise UnsafeFile(f"{path} is {info.st_size} bytes, more than the {limit} allowed")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path} is larger than the {limit} bytes allowed")
    return data


def gunzip_limited(data: bytes, limit: int, what: str = "the data") -> bytes:
    """Inflate gzip ``data`` to at most ``limit`` bytes (:class:`UnsafeFile` beyond)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as err:
        raise UnsafeFile(f"{what} is damaged gzip data ({err})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise UnsafeFile(f"{what} inflates to more than the {limit} bytes allowed")
    return out


def is_own_file(path: Path) -> bool:
    """A regular file (not a link) that may be deleted as one of ours."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
