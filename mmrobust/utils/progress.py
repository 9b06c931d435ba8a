"""A progress bar that suits both a terminal and a log file.

In a terminal it is tqdm's bar (count, rate, ETA, the current step in its label). Where stderr is
not a terminal (a Slurm log, a CI log, a pipe) carriage returns would fill the file with one
endless line, so it writes one line every ``interval`` seconds instead, and one at the end.
"""
import datetime
import os
import sys
import time
from typing import Optional

__all__ = ['Progress', 'INTERVAL_ENV']

#: Seconds between two lines where stderr is not a terminal (default 30).
INTERVAL_ENV = 'MMROBUST_PROGRESS_INTERVAL_S'


class Progress:
    """``total`` units of work; :meth:`update` adds done units.

    :meth:`describe` sets the current step's label. Disabled (``enabled=False``): does nothing.
    """

    def __init__(self, total: int, unit: str, desc: str, enabled: bool = True,
                 interval: Optional[float] = None) -> None:
        self.total, self.unit, self.desc, self.enabled = total, unit, desc, enabled
        self.interval = float(os.environ.get(INTERVAL_ENV, 30) if interval is None else interval)
        self.done, self.label = 0, ''
        self.start = time.monotonic()
        self.last = self.start - self.interval  # NOTE: the first update writes a line
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True)

    def set_total(self, total: int) -> None:
        """The amount of work, once it is known."""
        self.total = total
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()

    def describe(self, label: str) -> None:
        """Show ``label`` beside the bar."""
        self.label = label
        if self.bar is not None:
            self.bar.set_postfix_str(label)

    def update(self, n: int) -> None:
        """Count ``n`` more done."""
        if not self.enabled or n <= 0:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.last >= self.interval:
            self._line()

    def _line(self) -> None:
        self.last = time.monotonic()
        elapsed = self.last - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (str(datetime.timedelta(seconds=round((self.total - self.done) / rate)))
               if rate > 0 else '?')
        percent = 100.0 * self.done / self.total if self.total else 100.0
        print(f'{self.desc}: {self.done}/{self.total} {self.unit}s ({percent:.0f}%), '
              f'{rate:.1f} {self.unit}s/s, elapsed '
              f'{datetime.timedelta(seconds=round(elapsed))}, ETA {eta}'
              + (f', {self.label}' if self.label else ''), file=sys.stderr, flush=True)

    def close(self) -> None:
        """End the bar (or the plain progress lines)."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._line()
        self.enabled = False
