"""core/ids.py: request and completion ids read from the OS's random source in blocks."""

from __future__ import annotations

import os
import re

from laneway.core.ids import random_hex


def test_ids_are_32_hex_digits_and_unique_across_blocks() -> None:
    ids = [random_hex() for _ in range(random_hex.BLOCK * 5 + 7)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    """The child inherits the parent's unread block: it must start a block of its own, or the
    two processes (replicas forked from one) would hand out the same ids."""
    random_hex()  # a block is read and partly used
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.write(write, "".join(random_hex() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = "".join(random_hex() for _ in range(4))
    assert len(child) == 128 and child != parent
    assert not {child[i : i + 32] for i in range(0, 128, 32)} & {parent[i : i + 32] for i in range(0, 128, 32)}
