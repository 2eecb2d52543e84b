# SPDX-License-Identifier: Apache-2.0
"""Progress bars for long CLI phases: tqdm on a terminal, nothing when output is piped."""
import contextlib
import sys


class _Silent:
    def update(self, n=1):
        pass


@contextlib.contextmanager
def progress_bar(total, desc, unit="it", stream=None):
    """A bar with .update(n); silent unless `stream` (default stderr) is a terminal."""
    stream = stream or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        yield _Silent()
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield _Silent()
        return
    bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=stream, leave=False)
    try:
        yield bar
    finally:
        bar.close()
