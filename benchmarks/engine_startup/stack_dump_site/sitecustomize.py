"""Put on PYTHONPATH by engine_startup.py: every Python process of the engine (the LLM
process, a forked or spawned engine core, workers) writes all its threads' stacks to
$STACK_DUMP_DIR/stack-<pid>.txt on SIGUSR1, so a start-up that hangs says where."""

import faulthandler
import os
import signal
import sys


def _register() -> None:
    folder = os.environ.get("STACK_DUMP_DIR")
    if not folder:
        return
    path = os.path.join(folder, f"stack-{os.getpid()}.txt")
    f = open(path, "w")  # noqa: SIM115 - kept open for the process's life: faulthandler writes to it
    f.write(" ".join(sys.argv) + "\n")
    f.flush()
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
    globals()["_file"] = f


_register()
os.register_at_fork(after_in_child=_register)  # a forked child gets its own file
