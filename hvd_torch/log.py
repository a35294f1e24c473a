"""The `hvd_torch` Python logger, at the level HOROVOD_LOG_LEVEL gives the engine.

    HOROVOD_LOG_LEVEL=debug hvdrun -np 2 python train.py

Python messages (logging.getLogger("hvd_torch")) and the engine's C++ messages
(csrc/core/log.h) share the variable, the levels (trace, debug, info, warning, the
default, error, fatal) and the line format, Horovod's:

    [2024-05-01 12:00:00.123456: W basics.py:61] message

(`[W basics.py:61] message` with HOROVOD_LOG_HIDE_TIME=1). The logger writes to
stderr through a handler of its own and does not propagate, so that a program's
root handlers do not print each line twice; to route hvd_torch's lines through
your own handlers instead: `hvd_torch.log.use_my_handlers()`.
"""

from __future__ import annotations

import logging
import sys
import time

from hvd_torch import config

__all__ = ["LEVELS", "TRACE", "configure", "level_from_env", "logger", "use_my_handlers"]

TRACE = 5  # below logging.DEBUG, as Horovod's TRACE is below DEBUG
logging.addLevelName(TRACE, "TRACE")
LEVELS = {
    "trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO,
    "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL,
}  # fmt: skip
_LETTERS = {TRACE: "T", logging.DEBUG: "D", logging.INFO: "I", logging.WARNING: "W",
            logging.ERROR: "E", logging.CRITICAL: "F"}

logger = logging.getLogger("hvd_torch")


def level_from_env(environ=None) -> int:
    """The logging level HOROVOD_LOG_LEVEL names in environ (None: os.environ; warning
    when unset).

    Raises ValueError for a name that is not a level; hvd_torch.init() calls this
    (through configure()) before the engine starts."""
    raw = config.Logging.from_environment(environ).level
    text = (raw or "").strip().lower()
    if not text:
        return logging.WARNING
    if text not in LEVELS:
        raise ValueError(f"HOROVOD_LOG_LEVEL={raw!r} is not a log level; "
                         f"use one of {', '.join(LEVELS)}")
    return LEVELS[text]


class _Formatter(logging.Formatter):
    def __init__(self, hide_time: bool):
        super().__init__()
        self.hide_time = hide_time

    def format(self, record: logging.LogRecord) -> str:
        letter = _LETTERS.get(record.levelno, record.levelname[:1])
        where = f"{letter} {record.filename}:{record.lineno}"
        if not self.hide_time:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
            where = f"{stamp}.{int(record.msecs * 1000):06d}: {where}"
        text = f"[{where}] {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _Handler(logging.StreamHandler):
    """stderr looked up per record, so a redirected sys.stderr is honoured."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def configure(environ=None) -> None:
    """Sets the logger's level and format from the environment.  Raises ValueError
    for an unknown HOROVOD_LOG_LEVEL (the logger keeps its previous level).  environ:
    None for os.environ."""
    handler = next((h for h in logger.handlers if isinstance(h, _Handler)), None)
    if handler is None and not getattr(logger, "_hvd_torch_user_handlers", False):
        handler = _Handler()
        logger.addHandler(handler)
        logger.propagate = False
    if handler is not None:
        handler.setFormatter(_Formatter(config.Logging.from_environment(environ).hide_time))
    logger.setLevel(level_from_env(environ))


def use_my_handlers() -> None:
    """Drops hvd_torch's stderr handler: its lines propagate to the root logger's
    handlers (logging.basicConfig, ...). The level still follows HOROVOD_LOG_LEVEL."""
    for h in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(h)
    logger.propagate = True
    logger._hvd_torch_user_handlers = True


try:
    configure()
except ValueError:
    pass  # at import a bad value must not break `import hvd_torch`: init() raises it
