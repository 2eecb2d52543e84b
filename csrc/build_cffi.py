# SPDX-License-Identifier: Apache-2.0
"""cffi out-of-line API builder for rocketstore.kernels._cffi_lib over csrc/*.c.

Used by setup.py (`cffi_modules=["csrc/build_cffi.py:ffibuilder"]`); `python csrc/build_cffi.py`
builds the module in place for development. API mode (`set_source`), never `verify()`: the C
compiler checks every declaration below against the real headers.
"""
import os
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADERS = ["rs_common.h", "rs_format.h", "rs_crc32.h", "rs_msg.h", "rs_commitlog.h", "rs_cq.h",
           "rs_index.h", "rs_sync.h", "rs_batch.h"]
SOURCES = ["rs_crc32.c", "rs_msg.c", "rs_commitlog.c", "rs_cq.c", "rs_index.c", "rs_sync.c",
           "rs_batch.c"]
_DEFINE = re.compile(r"^#define\s+(RS_\w+)\s+\(?-?(?:0x[0-9A-Fa-f]+|\d+)\)?(?:\s|$)", re.M)

CDEF = """
typedef struct rs_scan_rec {
    int64_t pos;
    int64_t phy_offset;
    int64_t queue_offset;
    int64_t tags_code;
    int64_t store_timestamp;
    int64_t born_timestamp;
    int64_t prepared_tx_offset;
    int32_t size;
    int32_t queue_id;
    int32_t sys_flag;
    int32_t flag;
    int32_t body_crc;
    int32_t reconsume_times;
    int32_t body_off;
    int32_t body_len;
    int32_t topic_off;
    int32_t topic_len;
    int32_t props_off;
    int32_t props_len;
    int32_t info;
    int32_t topic_hash;
} rs_scan_rec;

uint32_t rs_crc32(uint32_t crc, const uint8_t *buf, size_t len);
int rs_java_hash(const uint8_t *buf, size_t len, int32_t *hash);
int rs_msg_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len, int v2);
int rs_msg_encode(uint8_t *out, size_t out_len, int64_t pos,
                  const uint8_t *topic, size_t topic_len,
                  const uint8_t *body, size_t body_len,
                  const uint8_t *props, size_t props_len,
                  int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                  int32_t sys_flag, int64_t born_timestamp,
                  const uint8_t *born_host, size_t born_host_len,
                  int64_t store_timestamp,
                  const uint8_t *store_host, size_t store_host_len,
                  int32_t reconsume_times, int64_t prepared_tx_offset, int v2);
int rs_msg_check(const uint8_t *buf, size_t len, int64_t pos, int check_crc,
                 rs_scan_rec *row, int32_t *size);
int rs_commitlog_append(uint8_t *out, size_t out_len, int64_t pos,
                        const uint8_t *rec, size_t rec_len,
                        int64_t queue_offset, int64_t phy_offset, int64_t store_timestamp);
int rs_commitlog_append_batch(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                              const uint8_t *recs, size_t recs_len,
                              const int64_t *queue_offsets, size_t n_offsets,
                              int64_t phy_base, int64_t store_timestamp,
                              int64_t *count, int64_t *nbytes);
int rs_commitlog_blank(uint8_t *out, size_t out_len, int64_t pos, int32_t size);
int rs_commitlog_scan(const uint8_t *buf, size_t len, int64_t start, int64_t end, int check_crc,
                      rs_scan_rec *out, int64_t cap,
                      int64_t *count, int64_t *stop_pos, int32_t *reason, int32_t *stop_size);
int rs_cq_encode(uint8_t *out, size_t out_len, int64_t pos,
                 int64_t offset, int32_t size, int64_t tags_code);
int rs_cq_encode_batch(uint8_t *out, size_t out_len, int64_t pos,
                       const int64_t *offsets, const int32_t *sizes, const int64_t *tags_codes,
                       size_t n, int64_t *nbytes);
int rs_cq_search(const uint8_t *buf, size_t len, int64_t start, int64_t end,
                 int64_t phy_offset, int64_t *index);
int rs_index_hash(const uint8_t *buf, size_t len, int32_t *hash);
int rs_index_put(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                 int32_t key_hash, int64_t phy_offset, int64_t store_timestamp);
int rs_index_put_batch(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                       const int32_t *key_hashes, const int64_t *phy_offsets,
                       const int64_t *store_timestamps, size_t n, int64_t *count);
int rs_index_keys(const uint8_t *buf, size_t len, const rs_scan_rec *rows, size_t nrows,
                  int32_t *out_hashes, int32_t *out_rows, size_t cap, size_t *count,
                  size_t *rows_done);
int rs_index_lookup(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                    int32_t key_hash, int64_t begin, int64_t end,
                    int64_t *out, int64_t cap, int64_t *count);
int rs_index_key_hash(const uint8_t *topic, size_t topic_len, const uint8_t *key,
                      size_t key_len, int32_t *hash);
int rs_index_walk(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                  int32_t key_hash, int64_t begin, int64_t end, int32_t *at, int64_t *hops,
                  int64_t *out, int64_t cap, int64_t *count);
int rs_index_has_key(const uint8_t *props, size_t props_len, const uint8_t *key,
                     size_t key_len);
int rs_index_match(const uint8_t *buf, size_t len, int64_t pos, int64_t phy_offset,
                   const uint8_t *topic, size_t topic_len, const uint8_t *key, size_t key_len,
                   int64_t begin, int64_t end, int32_t *size);
int rs_sync_range(const uint8_t *buf, size_t len, int64_t start, int64_t length);
int rs_batch_encode(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                    const uint8_t *topic, size_t topic_len, int32_t queue_id,
                    const uint8_t *bodies, size_t bodies_len, const int64_t *body_off,
                    const uint8_t *a, size_t a_len, const int64_t *a_off,
                    const uint8_t *b, size_t b_len, const int64_t *b_off,
                    const uint8_t *frags, size_t frags_len, const int64_t *frag_off,
                    int64_t first, int64_t n,
                    int32_t flag, int32_t sys_flag, int64_t born_timestamp,
                    const uint8_t *born_host, size_t born_host_len,
                    int64_t store_timestamp, const uint8_t *store_host, size_t store_host_len,
                    int64_t queue_offset, int64_t phy_base,
                    int64_t *count, int64_t *nbytes);
"""


def _constants():
    """`#define RS_X ...` for every integer constant of rs_common.h and rs_format.h, so that
    `_cffi_lib.lib.RS_X` carries the compiler's value (tests/test_contract.py compares them)."""
    names = []
    for header in ("rs_common.h", "rs_format.h"):
        with open(os.path.join(HERE, header)) as f:
            names += _DEFINE.findall(f.read())
    return "".join(f"#define {name} ...\n" for name in names)


def _rel(path):
    # setuptools wants sources relative to setup.py's directory, which is the cwd when it runs us.
    try:
        return os.path.relpath(path)
    except ValueError:   # another drive on Windows
        return path


def sanitize_args():
    """ROCKETSTORE_SANITIZE=address,undefined: the sanitizer flags, for compile and link alike
    (kept equal to setup.py's _sanitize_args). The last -O wins, so -O1 overrides -O3."""
    sanitize = os.environ.get("ROCKETSTORE_SANITIZE", "").strip()
    if not sanitize or os.name == "nt":
        return []
    return [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g", "-O1"]


def compile_args():
    """The C flags shared with setup.py: -O3 (or -O0 -g with asserts for ROCKETSTORE_DEBUG=1),
    plus the sanitizer flags of ROCKETSTORE_SANITIZE."""
    if os.name == "nt":
        return ["/O2"]
    if os.environ.get("ROCKETSTORE_DEBUG", "0") == "1":
        return ["-O0", "-g", "-std=c99", "-Wall", "-Wextra", "-UNDEBUG"] + sanitize_args()
    return ["-O3", "-std=c99", "-Wall", "-Wextra"] + sanitize_args()


ffibuilder = FFI()
ffibuilder.cdef(CDEF + _constants())
ffibuilder.set_source(
    "rocketstore.kernels._cffi_lib",
    "".join(f'#include "{h}"\n' for h in HEADERS),
    sources=[_rel(os.path.join(HERE, s)) for s in SOURCES],
    include_dirs=[_rel(HERE)],
    extra_compile_args=compile_args(),
    extra_link_args=sanitize_args(),
)

if __name__ == "__main__":
    os.chdir(os.path.dirname(HERE))
    ffibuilder.compile(verbose=True)
