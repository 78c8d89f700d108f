"""Child processes that bring their own children (a vLLM server and its engine core, torchrun
and its workers): each is started in a process group of its own, so stopping it stops them all."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def start_group(cmd: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(cmd)`` as the leader of a new session (and process group)."""
    return subprocess.Popen(cmd, start_new_session=True, **popen_kwargs)


def dump_group_stacks(proc: subprocess.Popen, wait_s: float = 3.0) -> None:
    """Make every Python process of the group print its threads' stacks and end (SIGABRT, which
    Python's fault handler answers with the stacks where ``PYTHONFAULTHANDLER`` is set): what a
    hung child was doing lands in its log before it is stopped."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGABRT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a child from start_group and whatever is left of its group (also when the child
    itself already exited): SIGTERM, up to ``grace_s`` for a clean exit, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
