"""A server process's heap: big buffers go back to the operating system when freed.

A dpagg server moves ciphertexts of ~370 KB (and pages of about 1 MB) through many threads at
once. glibc serves such blocks from per-thread heap arenas once its *dynamic* mmap threshold has
risen past them (it rises to the size of every mapped block that is freed, up to 32 MB), and an
arena returns freed memory to the system only from its top, so every thread's arena keeps the
high-water mark of the blocks it ever held. Measured through the services (2 owners, 2^21 bins,
this project's 2-core machine): the computation server's resident size during the uploads was
~1.4 GB with the dynamic threshold and 0.2-0.7 GB with a fixed one; its peak fell from 2.1 GB to
1.5 GB. Fixing the threshold at 128 KiB (glibc's default starting value; setting it turns the
dynamic adjustment off) maps each big block on its own and unmaps it when freed.
"""

from __future__ import annotations

import ctypes
import logging
import sys

__all__ = ["MMAP_THRESHOLD", "return_big_blocks_to_the_os"]

log = logging.getLogger("he_partition.execution")

#: Blocks at least this large are mapped on their own (bytes).
MMAP_THRESHOLD = 128 * 1024

_M_MMAP_THRESHOLD = -3  # mallopt parameter number (glibc malloc.h)


def return_big_blocks_to_the_os() -> bool:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD` for this process; False where there is no glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        done = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):  # musl or another libc: nothing to set
        return False
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused; the heap keeps glibc's dynamic threshold")
    return done
