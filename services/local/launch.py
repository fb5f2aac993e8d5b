"""The one child launcher: the command prefix that makes a child process die with its parent.

Where util-linux `setpriv` exists (Linux) children start through `setpriv --pdeathsig TERM`:
if the parent dies, even by SIGKILL, the child gets SIGTERM. Not a `preexec_fn`: forking
with Python code to run in the child deadlocks against grpc's fork handlers (or aborts with
"epoll_wait error: Bad file descriptor") once the parent has threads or a channel. The death
signal follows the thread that started the child, so start children from a thread that
outlives them (the main one).
"""

from __future__ import annotations

import shutil
import sys


def launcher() -> list[str]:
    """The command prefix that makes a child get SIGTERM when its parent dies (if available)."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []
