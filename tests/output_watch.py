"""Watch a child process's text output for a line (a server's "listening on ..."): shared by
the serve tests and ``benches/bench_server.py``."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from typing import IO


def watch_for(
    proc: subprocess.Popen[str],
    stream: IO[str] | None,
    pattern: str,
    log: list[str],
    *,
    timeout: float,
    poll: float,
) -> re.Match[str] | None:
    """Append every line of ``stream`` (an output of ``proc``) to ``log`` from a daemon thread,
    to the end; return the first match of ``pattern``, or ``None`` once ``proc`` has exited or
    ``timeout`` seconds have passed without one (checked every ``poll`` seconds)."""
    found = threading.Event()
    match: list[re.Match[str]] = []

    def read() -> None:
        assert stream is not None
        for line in stream:
            log.append(line)
            m = re.search(pattern, line)
            if m and not found.is_set():
                match.append(m)
                found.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found.wait(poll):
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
    return match[0]
