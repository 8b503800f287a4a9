"""Text a person reads in a terminal: every value a publisher chose (ids, names, queues,
messages, tracebacks) with its control characters shown, not obeyed.

A task name holding ``ESC ] 0 ; ... BEL`` would retitle the terminal, ``ESC [ 2 J`` clear
it, a ``\\r`` or a newline forge a line, a bidi override (U+202E) reorder what follows.
:func:`printable` shows each such character as a Python escape (``\\x1b``, ``\\r``,
``\\u202e``): what :meth:`str.isprintable` refuses (controls C0 and C1, DEL, format
characters among them the bidi controls, separators other than the space, lone surrogates,
unassigned and private-use code points), and the backslash itself (``\\\\``), so two
different values never look alike. Linear in the text (one pass, no backtracking).
"""

from __future__ import annotations

import logging

__all__ = ["PrintableRecords", "escaped_logger", "printable", "unprintable"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def unprintable(text: str) -> set[str]:
    """The distinct characters of ``text`` a terminal could obey (the one rule: what
    :meth:`str.isprintable` refuses)."""
    return set() if text.isprintable() else {c for c in set(text) if not c.isprintable()}


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF
            else f"\\U{code:08x}")


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with every character a terminal could obey shown escaped (``\\x1b``,
    ``\\u202e``, and ``\\\\`` for a backslash, so that no two values look alike);
    ``newlines=True`` keeps line breaks (a traceback's block) and escapes the rest, a
    ``\\r`` included. Printable text without a backslash comes back unchanged."""
    unsafe = unprintable(text)
    if "\\" in text:
        unsafe.add("\\")
    if newlines:
        unsafe.discard("\n")
    # one translation table of the distinct characters needing it: C speed, whatever
    # the mix (a callback per match would cost a Python call per hostile character)
    return text.translate({ord(c): _escape(c) for c in unsafe}) if unsafe else text


class PrintableRecords(logging.Filter):
    """A log record's message shown through :func:`printable`: jobbers' log lines quote what
    a publisher chose (task ids, names, queues, exception text), and a newline there would
    forge a log line, an escape sequence reach the terminal that tails the log. The
    message is formatted once here (its arguments left empty), only when it needs it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - logging reports its own formatting errors
            return True
        if "\\" in message or not message.isprintable():
            record.msg, record.args = printable(message), ()
        return True


_RECORDS = PrintableRecords()


def escaped_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with :class:`PrintableRecords` on it (a logger's filter
    applies to every record made on that logger, whatever handlers the application
    configures): how every jobbers module gets its logger."""
    logger = logging.getLogger(name)
    if _RECORDS not in logger.filters:
        logger.addFilter(_RECORDS)
    return logger
