"""validation/sampler.py: the statistical profiler's shares follow where the time went, C
calls included (charged to their caller)."""

import sys
import time

import pytest

from validation.sampler import Sampler

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGALRM")


def _hot(seconds):
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += 1
    return n


def _waits(seconds):
    time.sleep(seconds)         # one C call: charged to this frame


def _work():
    _hot(0.3)
    _waits(0.15)


def test_shares_follow_the_time_spent():
    with Sampler(interval=1e-3) as s:
        _work()
    n, incl, own = s.shares()
    name = {f.rsplit(":", 1)[1]: f for f in incl}
    assert n > 100
    assert incl[name["_work"]] > 0.95
    # (2:1 in wall time; a loaded machine delivers fewer of the hot loop's ticks)
    assert incl[name["_hot"]] > 0.3 and incl[name["_waits"]] > 0.15
    assert incl[name["_hot"]] + incl[name["_waits"]] > 0.9
    assert own.get(name["_waits"], 0) > 0.15      # the sleep, charged to its caller
    n_in, incl_in, _ = s.shares(within=(__name__.rsplit(".", 1)[-1] + ".py", "_waits"))
    assert 0 < n_in < n and incl_in[name["_waits"]] == 1.0


def test_the_timer_is_stopped_and_the_handler_restored():
    import signal
    before = signal.getsignal(signal.SIGALRM)
    with Sampler():
        pass
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
