"""The stop signals' dispositions the tests take for granted.

A suite started in the background by a non-interactive shell (``cmd &``) inherits SIGINT
ignored, one started under ``nohup`` SIGHUP ignored; children inherit that too, and Ditto
rightly keeps an ignored signal ignored (ditto_core.base.signals.install). The tests that send
SIGINT, SIGTERM or SIGHUP to Ditto's processes expect the default dispositions, so for the
whole session an ignored stop signal is taken back to its default (SIGINT to Python's
KeyboardInterrupt handler), and restored afterwards."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(scope="session", autouse=True)
def stop_signals_not_ignored():
    default = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
               signal.SIGHUP: signal.SIG_DFL}
    old = {s: signal.getsignal(s) for s in default}
    for s, h in old.items():
        if h == signal.SIG_IGN:
            signal.signal(s, default[s])
    yield
    for s, h in old.items():
        signal.signal(s, h)
