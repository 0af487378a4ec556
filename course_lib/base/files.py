"""Files written whole: the one atomic writer that results, checkpoints and caches go through."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

UMASK = os.umask(0o022)  # the process's umask (read by setting it, then restored on the next line)
os.umask(UMASK)


@contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file object on a temporary file beside `path` (.<name>.<random>.tmp, same disk); when the block ends without
    an error it is flushed to disk and os.replace'd onto `path`, else removed: a process killed at any instant leaves
    the previous file or the new one, never half a file. OS errors propagate; each caller words its own message."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~UMASK)  # what open() would give, not mkstemp's owner-only 0600
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": ""})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
