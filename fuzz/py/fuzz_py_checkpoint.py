# SPDX-License-Identifier: Apache-2.0
"""py_checkpoint: any `checkpoint` file content through StoreCheckpoint (read-only open):
short, long, or garbage bytes give some timestamps, never an exception."""
import _harness  # sets sys.path; instruments rocketstore under atheris

with _harness.instrumented(__name__):
    from rocketstore.checkpoint import StoreCheckpoint


class _MemFS:
    def __init__(self, data):
        self.data = data

    def exists(self, path):
        return True

    def read_bytes(self, path):
        return self.data


def TestOneInput(data):
    c = StoreCheckpoint("/nonexistent/checkpoint", _MemFS(data), read_only=True)
    assert c.min_timestamp >= 0
    c.min_timestamp_index
    c.close()


if __name__ == "__main__":
    _harness.run(TestOneInput)
