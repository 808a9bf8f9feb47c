"""A loader never crosses fork(): the child gets errors, not the parent's engine."""

import os

import pytest
import ringfeed

from conftest import synth_content, tar_keys


def run_in_child(fn):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = fn()
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_child_cannot_use_the_parents_loader_but_can_open_its_own(small_shards):
    total = len(tar_keys(small_shards))
    loader = ringfeed.Loader(small_shards, batch_size=8)
    batch = next(loader)
    view = batch["jpg"]

    def child():
        for use in (lambda: next(loader), lambda: loader.stats(), lambda: batch.keys, lambda: view.lengths):
            try:
                use()
                return 2
            except ringfeed.ForkedError:
                pass
        loader.close()  # a no-op in the child: never touches the parent's engine
        batch.release()
        with ringfeed.Loader(small_shards, batch_size=8) as mine:
            n = sum(len(b) for b in mine)
        return 0 if n == total else 3

    assert run_in_child(child) == 0
    # the parent's loader and batch are unharmed
    assert len(batch.keys) == 8
    batch.release()
    rest = sum(len(b) for b in loader)
    loader.close()
    # The first batch of 8, then every other sample, once.
    assert rest == total - 8


def test_gc_in_the_child_does_not_release_the_parents_batches(small_shards):
    loader = ringfeed.Loader(small_shards, batch_size=8)
    batch = next(loader)

    def child():
        global_batch = [batch]
        global_batch.clear()  # dropping the last child-side reference runs __del__ here
        import gc

        gc.collect()
        return 0

    assert run_in_child(child) == 0
    key = batch.keys[0]
    data = bytes(batch["jpg"][0])  # still valid in the parent: the generator's bytes
    assert len(data) > 0 and data == synth_content(0, key, "jpg", len(data)), key
    assert batch.release() is True
    loader.close()
