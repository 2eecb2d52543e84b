# SPDX-License-Identifier: Apache-2.0
"""py_record: one CommitLog record through MessageExt.decode, the properties parser, and
commitlog_scan of every backend at once (differential: cext, cffi and pure must agree on the
rows, the stop position and the reason). decode may raise only CorruptRecordError."""
import _harness  # sets sys.path; instruments rocketstore under atheris

import numpy as np

with _harness.instrumented(__name__):
    from rocketstore import format as F
    from rocketstore import kernels
    from rocketstore.errors import CorruptRecordError
    from rocketstore.message import MessageExt, string_to_properties

BACKENDS = [kernels.load(n) for n in kernels.available()]


def TestOneInput(data):
    try:
        m = MessageExt.decode(data, check_crc=True)
    except CorruptRecordError:
        m = None
    if m is not None:
        string_to_properties(m.properties_string)
        m.to_dict()
    results = []
    for k in BACKENDS:
        out = np.zeros(4, dtype=F.SCAN_DTYPE)
        res = k.commitlog_scan(data, 0, len(data), True, out)
        results.append((k.NAME, res, out[:res[0]].tobytes()))
    for name, res, rows in results[1:]:
        assert (res, rows) == results[0][1:], (name, res, results[0])
    # A record the scanner accepts must decode (the dump/get path relies on it).
    for row in np.frombuffer(results[0][2], dtype=F.SCAN_DTYPE):
        p, n = int(row["pos"]), int(row["size"])
        MessageExt.decode(data[p:p + n], check_crc=True)


if __name__ == "__main__":
    _harness.run(TestOneInput)
