"""The ``dnnkit`` logger, without importing :mod:`logging` at ``import dnnkit``.

``logging`` (with ``traceback``, ``string`` and its other imports, about 8 ms of CPU) is
loaded on the first message or level query, not by ``import dnnkit`` (tests/test_packaging.py
times that import). ``log`` stands for ``logging.getLogger("dnnkit")``: ``log.debug(...)``,
``log.info(...)``, ``log.warning(...)``, ``log.log(level, ...)``. A user configures it as
usual, through ``logging``.

``debug_enabled()`` is the check on the dispatcher's per-call path: while ``logging`` has never
been imported nobody can have set a level or a handler, so the answer is no without importing
it; once it has been, the logger's own ``isEnabledFor`` (cached by ``logging``) decides.
"""

import sys

DEBUG, INFO = 10, 20           # logging.DEBUG and logging.INFO

_logger = None                 # logging.getLogger("dnnkit"), once logging is loaded


def _get():
    global _logger
    if _logger is None:
        import logging
        _logger = logging.getLogger("dnnkit")
    return _logger


class _Log:
    """``logging.getLogger("dnnkit")``, resolved on first use."""

    __slots__ = ()

    def __getattr__(self, name):
        return getattr(_get(), name)


log = _Log()


def debug_enabled():
    """Whether the ``dnnkit`` logger passes DEBUG messages (never imports ``logging``)."""
    if _logger is None:
        if "logging" not in sys.modules:
            return False
        _get()
    return _logger.isEnabledFor(DEBUG)
