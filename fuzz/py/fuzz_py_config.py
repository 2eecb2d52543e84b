# SPDX-License-Identifier: Apache-2.0
"""py_config: config JSON through ConfigManager.load (first byte picks the manager: topics,
subscriptionGroup, consumerOffset, delayOffset). load must answer True/False and log, never
raise: the broker-side contract is "fall back to .bak, or refuse to start"."""
import _harness  # sets sys.path; instruments rocketstore under atheris

import logging

with _harness.instrumented(__name__):
    from rocketstore import config_manager as CM

CLASSES = (CM.TopicConfigManager, CM.SubscriptionGroupManager, CM.ConsumerOffsetManager,
           CM.DelayOffsetManager)


class _MemFS:
    """Just enough of fs.FileSystem for ConfigManager.load: the main file, no .bak."""

    def __init__(self, data):
        self.data = data

    def read_bytes(self, path):
        if path.endswith(".bak"):
            raise FileNotFoundError(path)
        return self.data


def TestOneInput(data):
    if not data:
        return
    cls = CLASSES[data[0] % len(CLASSES)]
    m = cls("/nonexistent", _MemFS(data[1:]), clock=lambda: 0, read_only=True)
    assert m.load() in (True, False)


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)     # the fuzzer only: every corrupt input logs a warning
    _harness.run(TestOneInput)
