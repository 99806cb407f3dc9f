"""Helpers made once per process (``_per_process``): once for all threads, again in a fork."""

from __future__ import annotations

import os
import threading

from monarch.core._payload._per_process import PerProcess


def test_threads_share_what_the_first_of_them_made() -> None:
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    helper = PerProcess(make)
    start = threading.Barrier(8)
    got: list[object] = []

    def use() -> None:
        start.wait()
        got.append(helper.get())

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and got == made * 8


def test_a_forked_child_makes_its_own() -> None:
    helper = PerProcess(lambda: (os.getpid(), object()))
    parents = helper.get()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own, made by it; ours again when asked again
        mine = helper.get()
        ok = mine[0] == os.getpid() and mine is not parents and helper.get() is mine
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"1"
    assert os.waitpid(pid, 0)[1] == 0
    assert helper.get() is parents
