"""Say what a long command is doing: a live bar on a terminal, one plain line per step in a log.

`Progress.step(what, total)` is a context manager around one long step (encrypting a
million bins, uploading, waiting for a release). On a terminal it draws a tqdm bar (or, with
no total, the elapsed time) as soon as the step starts; in non-interactive output (a pipe, a
CI log) it prints `what ...` when the step starts, a `what: N/M (P%), T s` line at most every
`heartbeat` seconds while it runs (the first one second in, with the time left estimated from
the rate so far: `what: N/M (P%), T s, about L s left`), and `what: done in T s` when it ends,
so a log shows every step and the last line says where it stopped. Everything goes to stderr by default:
stdout stays the command's result (and `--json` stays machine-readable).

The lines describe only this process's own work and the public state of a request
(elapsed time, chunks handled); they carry no data values.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

__all__ = ["Progress", "Advance", "QUIET"]

#: Called with how many units were done since the last call (0 just refreshes the elapsed time).
Advance = Callable[[int], None]

#: Seconds between two progress lines of one step in a log.
HEARTBEAT = 5.0

#: Seconds into a step before its first progress line in a log (then one every HEARTBEAT).
FIRST_LINE = 1.0


class Progress:
    """A reporter for long steps; `enabled=False` (or `QUIET`) prints nothing."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, interactive: bool | None = None,
                 heartbeat: float = HEARTBEAT) -> None:
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty()) if interactive is None else interactive
        self.heartbeat = heartbeat

    def say(self, line: str) -> None:
        """One line (a step that needs no bar, or a final line)."""
        if self.enabled:
            print(line, file=self.stream, flush=True)

    @contextmanager
    def step(self, what: str, total: int | None = None, unit: str = "") -> Iterator[Advance]:
        """Report one step; the yielded `advance(n)` counts n more units done (of `total`, if known)."""
        if not self.enabled:
            yield _ignore
            return
        start = time.monotonic()
        if self.interactive:
            bar = _terminal_bar(self.stream, what, total, unit)
            try:
                yield lambda n: bar.update(n) if n else bar.refresh()
            finally:
                bar.close()
        else:
            print(f"{what} ...", file=self.stream, flush=True)
            yield _LogLines(self, what, total, unit, start)
        print(f"{what}: done in {time.monotonic() - start:.1f} s", file=self.stream, flush=True)

    @contextmanager
    def status(self, what: str) -> Iterator[Callable[[str], None]]:
        """Report one step whose state is a line of text (a release on a server); the yielded `update(text)` sets it.

        On a terminal the elapsed time and the newest text redraw in place; in a log `what: text, T s` is
        printed when the text first changes from empty and then at most every `heartbeat` seconds.
        """
        if not self.enabled:
            yield lambda text: None
            return
        start = time.monotonic()
        if self.interactive:
            bar = _terminal_bar(self.stream, what, None, "")
            try:
                def redraw(text: str) -> None:
                    bar.set_postfix_str(text, refresh=False)
                    bar.refresh()

                yield redraw
            finally:
                bar.close()
        else:
            print(f"{what} ...", file=self.stream, flush=True)
            last_at, last_text = [start - self.heartbeat], [""]

            def line(text: str) -> None:
                now = time.monotonic()
                if not text or (now - last_at[0] < self.heartbeat and last_text[0]):
                    return
                last_at[0], last_text[0] = now, text
                print(f"{what}: {text}, {now - start:.0f} s", file=self.stream, flush=True)

            yield line
        print(f"{what}: done in {time.monotonic() - start:.1f} s", file=self.stream, flush=True)


def _ignore(n: int) -> None:
    return None


class _LogLines:
    """`advance` for a log: a line at most every `heartbeat` seconds."""

    def __init__(self, progress: Progress, what: str, total: int | None, unit: str, start: float) -> None:
        self._p, self._what, self._total, self._unit, self._start = progress, what, total, unit, start
        self._done = 0
        self._next = start + min(FIRST_LINE, progress.heartbeat)  # the first line a second in, not a heartbeat

    def __call__(self, n: int) -> None:
        self._done += n
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._p.heartbeat
        elapsed = now - self._start
        if self._total:
            if self._unit == "B":
                where = f"{self._done / 1e6:,.1f}/{self._total / 1e6:,.1f} MB"
            else:
                where = f"{self._done:,}/{self._total:,}{f' {self._unit}' if self._unit else ''}"
            left = _time_left(self._done, self._total, elapsed)
            where += f" ({100 * self._done / self._total:.0f}%), {elapsed:.0f} s{left}"
        else:
            where = f"still running, {elapsed:.0f} s"
        print(f"{self._what}: {where}", file=self._p.stream, flush=True)


def _time_left(done: int, total: int, elapsed: float) -> str:
    """", about N s left" at the rate so far; "" before anything is done or once everything is."""
    if done <= 0 or done >= total or elapsed <= 0:
        return ""
    left = (total - done) * elapsed / done
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"


def _screen(stream: TextIO) -> tuple[int, int]:
    """The terminal's (columns, lines); 80 x 24 where it reports none (a fresh pseudo-terminal says 0 x 0, and
    tqdm then hides every bar)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.columns or 80, size.lines or 24
    except (AttributeError, OSError, ValueError):
        return 80, 24


def _terminal_bar(stream: TextIO, what: str, total: int | None, unit: str) -> Any:
    from tqdm import tqdm

    common: dict[str, Any] = {"desc": what, "file": stream, "leave": False, "mininterval": 0.2,
                              "ncols": _screen(stream)[0], "nrows": _screen(stream)[1]}
    if total is None:  # no count to show: the elapsed time, refreshed on every advance(0)
        return tqdm(bar_format="{desc}: {elapsed}{postfix}", **common)
    return tqdm(total=total, unit=unit or "it", unit_scale=unit == "B", unit_divisor=1024, **common)


#: A reporter that prints nothing (the SDK's default: a library does not write to the terminal uninvited).
QUIET = Progress(enabled=False)
