# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpora under fuzz/corpus/<target>/ from the broker-written golden store
(tests/data/rmq-4.9.8-basic) plus a few synthesized shapes the golden store lacks (v2 magic,
IPv6 hosts, a looping index chain). Deterministic: rerunning rewrites the same files.

    python fuzz/make_seeds.py          # then commit fuzz/corpus (kept well under 2 MB)

Each seed starts with the control bytes its harness reads first (see fuzz/*.c, fuzz/py/*.py).
"""
import hashlib
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from rocketstore import format as F                  # noqa: E402
from rocketstore.kernels import pure                 # noqa: E402

STORE = os.path.join(HERE, "..", "tests", "data", "rmq-4.9.8-basic", "store")
CORPUS = os.path.join(HERE, "corpus")


def read(*parts):
    with open(os.path.join(STORE, *parts), "rb") as f:
        return f.read()


def records(buf):
    out = np.zeros(256, dtype=F.SCAN_DTYPE)
    n, stop, reason, _ = pure.commitlog_scan(buf, 0, len(buf), True, out)
    return [(int(r["pos"]), int(r["size"])) for r in out[:n]], stop


def synth(v2=False, born6=False, store6=False, props=b"TAGS\x01TagA\x02KEYS\x01k1 k2", body=b"hi"):
    sys_flag = (F.BORNHOST_V6_FLAG if born6 else 0) | (F.STOREHOSTADDRESS_V6_FLAG if store6 else 0)
    bh = (b"\0" * 15 + b"\1" if born6 else b"\x7f\0\0\1") + b"\0\0\x27\x10"
    sh = (b"\0" * 15 + b"\1" if store6 else b"\x0a\0\0\2") + b"\0\0\x29\x1a"
    topic = b"SynthTopic"
    size = pure.msg_size(sys_flag, len(body), len(topic), len(props), v2)
    out = bytearray(size)
    pure.msg_encode(out, 0, topic, body, props, 1, 0, 5, 4096, sys_flag, 1700000000000, bh,
                    1700000000123, sh, 0, 0, v2)
    return bytes(out)


def write(target, seeds):
    d = os.path.join(CORPUS, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for s in seeds:
        name = hashlib.sha1(s).hexdigest()[:16]
        with open(os.path.join(d, name), "wb") as f:
            f.write(s)


def main():
    cl0 = read("commitlog", "00000000000000000000")
    recs, stop = records(cl0)
    picks = [cl0[p:p + n] for p, n in recs[:: max(1, len(recs) // 8)]]
    synths = [synth(), synth(v2=True), synth(born6=True), synth(store6=True),
              synth(v2=True, born6=True, store6=True), synth(props=b""), synth(body=b"")]
    blank = struct.pack(">ii", 181, F.BLANK_MAGIC_CODE)

    # fuzz_msg_check: ctl byte (pos 0, CRC on) + one record.
    write("msg_check", [b"\x10" + r for r in picks + synths] + [b"\x00" + blank])
    # fuzz_commitlog_scan: start, cut, cap, crc + a run of records ending in the file's blank.
    p0, _ = recs[0]
    pl, nl = recs[-3]
    write("commitlog_scan", [b"\x00\x00\x08\x01" + cl0[p0:recs[4][0]],
                             b"\x00\x00\x08\x01" + cl0[pl:stop + 8],
                             b"\x00\x00\x08\x01" + b"".join(synths),
                             b"\x00\x05\x02\x00" + cl0[p0:recs[2][0]] + b"\0" * 16])
    # fuzz_properties: ctl (v2 bit, topic length) + topic + properties of real records.
    props = []
    for p, n in recs[:: max(1, len(recs) // 8)]:
        out = np.zeros(1, dtype=F.SCAN_DTYPE)
        pure.commitlog_scan(cl0, p, p + n, False, out)
        r = out[0]
        t = cl0[p + int(r["topic_off"]):p + int(r["topic_off"]) + int(r["topic_len"])]
        pr = cl0[p + int(r["props_off"]):p + int(r["props_off"]) + int(r["props_len"])]
        props.append(bytes([(len(t) % 32) << 1]) + t + pr)
    props.append(b"\x01TAGS\x01a\x02TAGS\x01b\x02\x01x\x02y\x01")
    write("properties", props)
    # fuzz_cq_search: key (LE) + start + 10 units of a real ConsumeQueue.
    cq = read("consumequeue", "LogTopic", "0", "00000000000000000000")
    key = struct.unpack_from(">q", cq, 100)[0]
    write("cq_search", [struct.pack("<q", key) + b"\x00" + cq[:200],
                        struct.pack("<q", 0) + b"\x03" + cq[:203]])
    # fuzz_index: slot_num-1, index_num-1, key hash, begin, end, cap + a real index file's
    # first bytes; plus a crafted 3-entry chain that loops 3 -> 2 -> 3.
    idx = read("index", sorted(os.listdir(os.path.join(STORE, "index")))[0])
    head = b"\x3f\x3f" + struct.pack("<I", 12345) + struct.pack("<q", 0) \
        + struct.pack("<q", 2**62) + b"\x07"
    loop = bytearray(40 + 4 * 4 + 8 * 20)
    struct.pack_into(">qqqqii", loop, 0, 1000, 2000, 0, 0, 1, 4)
    struct.pack_into(">i", loop, 40 + 4 * (7 % 4), 3)
    for n, prev in ((1, 0), (2, 3), (3, 2)):
        struct.pack_into(">iqii", loop, 40 + 16 + n * 20, 7, 100 * n, 0, prev)
    write("index", [head + idx[:40 + 64 * 4 + 64 * 20],
                    b"\x03\x07" + struct.pack("<I", 7) + struct.pack("<q", 0)
                    + struct.pack("<q", 2**62) + b"\x07" + bytes(loop)])
    # Python targets.
    write("py_record", [r for r in picks + synths] + [blank + b"\0" * 8])
    ckpt = read("checkpoint")
    write("py_checkpoint", [ckpt[:64], ckpt[:24], b""])
    cfg = [read("config", n) for n in sorted(os.listdir(os.path.join(STORE, "config")))
           if n.endswith(".json")]
    write("py_config", [bytes([i]) + c[:4096] for i, c in enumerate(cfg)]
          + [b"\x00{\"topicConfigTable\":{\"T\":{\"readQueueNums\":1e400}}}"])
    frames = struct.pack(">qi", 0, 12) + b"x" * 12 + struct.pack(">qi", 12, 0) \
        + struct.pack(">qi", 12, 5) + b"y" * 3
    write("py_ha", [frames, struct.pack(">qi", 0, 2**31 - 1), struct.pack(">qi", 8, 1) + b"z",
                    struct.pack(">qqqq", 1, 2, 3, 4)])


if __name__ == "__main__":
    main()
