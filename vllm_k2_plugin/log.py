"""The plugin's loggers: every one a child of vLLM's ``vllm`` logger (``vllm.k2_plugin.<part>``),
so vLLM's handler, format and level (``VLLM_LOGGING_LEVEL``, ``VLLM_CONFIGURE_LOGGING``) apply to
our lines as to vLLM's own.

vLLM is imported here, when a line is about to be logged, never at import: `vllm-k2` commands
that run without vLLM (or torch) get a plain logger of the same name.
"""

from __future__ import annotations

import functools
import logging

ROOT = "vllm.k2_plugin"


@functools.cache
def get_logger(part: str) -> logging.Logger:
    """The logger for one part of the plugin (a feature folder's name: "comm", "patching", ...)."""
    name = f"{ROOT}.{part}"
    try:
        from vllm.logger import init_logger
    except ImportError:  # no vLLM here (the CLI's training and planning commands)
        return logging.getLogger(name)
    return init_logger(name)
