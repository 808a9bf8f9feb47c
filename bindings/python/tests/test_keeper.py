"""The one way Python gives a batch's memory back (`_lease._Keeper`): once,
when the last reference goes, never from a forked child's copy, and only by
a keeper that says how."""

import gc
import sys

import pytest

from ringfeed import _lease


class _Counted(_lease._Keeper):
    __slots__ = ("log",)

    def __init__(self, log):
        super().__init__()
        self.log = log

    def _forget(self):
        self.log.append("forget")

    def _give_back(self):
        self.log.append("give back")


def test_a_keeper_gives_back_once_when_its_last_reference_goes():
    log = []
    k = _Counted(log)
    also = k
    del k
    assert log == []
    del also
    gc.collect()
    assert log == ["forget", "give back"]


def test_a_forked_child_s_copy_forgets_but_gives_nothing_back():
    # What `os.register_at_fork` does in a child, done here: the keeper made
    # before it belongs to the parent.
    log = []
    k = _Counted(log)
    _lease._after_fork_in_child()
    try:
        del k
        gc.collect()
    finally:
        _lease._fork_generation -= 1
    assert log == ["forget"]
    # Control: one made after the fork is the child's to give back.
    k = _Counted(log)
    del k
    assert log == ["forget", "forget", "give back"]


def test_a_keeper_must_say_how_it_gives_back():
    with pytest.raises(TypeError, match="_give_back"):

        class _Silent(_lease._Keeper):
            __slots__ = ()

    class _Said(_lease._Keeper):
        __slots__ = ()

        def _give_back(self):
            pass

    _Said()


def test_a_failing_give_back_is_not_reported_from_the_collector(monkeypatch):
    # At interpreter shutdown the library may be gone: the give-back fails,
    # and the keeper's end says nothing (Python would print an "Exception
    # ignored in __del__" for each such batch).
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    class _Failing(_lease._Keeper):
        __slots__ = ()

        def _give_back(self):
            raise OSError("the library is gone")

    k = _Failing()
    del k
    gc.collect()
    assert reported == []

    # Control: the same failure from a `__del__` of its own is reported.
    class _Bare:
        def __del__(self):
            raise OSError("the library is gone")

    b = _Bare()
    del b
    gc.collect()
    assert len(reported) == 1 and isinstance(reported[0].exc_value, OSError)
