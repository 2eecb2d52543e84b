# SPDX-License-Identifier: Apache-2.0
# The C surface of csrc/, declared once (as uvloop's includes/uv.pxd does for libuv).
# Every function is pure arithmetic on caller buffers (rs_sync_range alone does I/O), so the
# whole block is nogil: _cext.pyx decides per call whether releasing the GIL pays.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

cdef extern from * nogil:
    """
    #include "rs_common.h"
    #include "rs_format.h"
    #include "rs_crc32.h"
    #include "rs_msg.h"
    #include "rs_commitlog.h"
    #include "rs_cq.h"
    #include "rs_index.h"
    #include "rs_sync.h"
    #include "rs_batch.h"
    """
    # rs_common.h / rs_format.h
    const int RS_OK
    const int RS_E_BOUNDS
    const int RS_E_ARG
    const int RS_CQ_STORE_UNIT_SIZE
    const int RS_END_FILE_MIN_BLANK_LENGTH
    const int RS_MAX_PROPERTIES_LENGTH
    const int RS_TRANSACTION_TYPE_MASK
    const int RS_TRANSACTION_PREPARED_TYPE
    const int RS_TRANSACTION_ROLLBACK_TYPE
    const int RS_BORNHOST_V6_FLAG
    const int RS_STOREHOSTADDRESS_V6_FLAG
    const int RS_SCAN_INFO_SCHEDULE
    const int RS_SCAN_INFO_V2
    const int RS_POS_BORNHOST
    const int32_t RS_MESSAGE_MAGIC_CODE
    const int32_t RS_MESSAGE_MAGIC_CODE_V2
    int32_t rs_load_i32(const uint8_t *p)
    int64_t rs_load_i64(const uint8_t *p)

    ctypedef struct rs_scan_rec:
        int64_t pos
        int64_t phy_offset
        int64_t queue_offset
        int64_t tags_code
        int64_t store_timestamp
        int64_t born_timestamp
        int64_t prepared_tx_offset
        int32_t size
        int32_t queue_id
        int32_t sys_flag
        int32_t flag
        int32_t body_crc
        int32_t reconsume_times
        int32_t body_off
        int32_t body_len
        int32_t topic_off
        int32_t topic_len
        int32_t props_off
        int32_t props_len
        int32_t info
        int32_t topic_hash

    # rs_crc32.h
    uint32_t rs_crc32(uint32_t crc, const uint8_t *buf, size_t len)
    int rs_java_hash(const uint8_t *buf, size_t len, int32_t *hash)

    # rs_msg.h
    int rs_msg_size(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len,
                    int v2)
    int rs_msg_encode(uint8_t *out, size_t out_len, int64_t pos,
                      const uint8_t *topic, size_t topic_len,
                      const uint8_t *body, size_t body_len,
                      const uint8_t *props, size_t props_len,
                      int32_t queue_id, int32_t flag, int64_t queue_offset, int64_t phy_offset,
                      int32_t sys_flag, int64_t born_timestamp,
                      const uint8_t *born_host, size_t born_host_len,
                      int64_t store_timestamp,
                      const uint8_t *store_host, size_t store_host_len,
                      int32_t reconsume_times, int64_t prepared_tx_offset, int v2)
    ctypedef struct rs_part:
        const uint8_t *buf
        size_t len
    int rs_msg_encode_parts(uint8_t *out, size_t out_len, int64_t pos,
                            const uint8_t *topic, size_t topic_len,
                            const uint8_t *body, size_t body_len,
                            const rs_part *props, size_t n_parts,
                            int32_t queue_id, int32_t flag, int64_t queue_offset,
                            int64_t phy_offset, int32_t sys_flag, int64_t born_timestamp,
                            const uint8_t *born_host, size_t born_host_len,
                            int64_t store_timestamp,
                            const uint8_t *store_host, size_t store_host_len,
                            int32_t reconsume_times, int64_t prepared_tx_offset, int v2)
    int rs_msg_check(const uint8_t *buf, size_t len, int64_t pos, int check_crc,
                     rs_scan_rec *row, int32_t *size)

    # rs_commitlog.h
    int rs_commitlog_append(uint8_t *out, size_t out_len, int64_t pos,
                            const uint8_t *rec, size_t rec_len,
                            int64_t queue_offset, int64_t phy_offset, int64_t store_timestamp)
    int rs_commitlog_append_batch(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                                  const uint8_t *recs, size_t recs_len,
                                  const int64_t *queue_offsets, size_t n_offsets,
                                  int64_t phy_base, int64_t store_timestamp,
                                  int64_t *count, int64_t *nbytes)
    int rs_commitlog_blank(uint8_t *out, size_t out_len, int64_t pos, int32_t size)
    int rs_commitlog_scan(const uint8_t *buf, size_t len, int64_t start, int64_t end,
                          int check_crc, rs_scan_rec *out, int64_t cap,
                          int64_t *count, int64_t *stop_pos, int32_t *reason, int32_t *stop_size)

    # rs_cq.h
    int rs_cq_encode(uint8_t *out, size_t out_len, int64_t pos,
                     int64_t offset, int32_t size, int64_t tags_code)
    int rs_cq_encode_batch(uint8_t *out, size_t out_len, int64_t pos,
                           const int64_t *offsets, const int32_t *sizes,
                           const int64_t *tags_codes, size_t n, int64_t *nbytes)
    int rs_cq_search(const uint8_t *buf, size_t len, int64_t start, int64_t end,
                     int64_t phy_offset, int64_t *index)

    # rs_index.h
    int rs_index_hash(const uint8_t *buf, size_t len, int32_t *hash)
    int rs_index_put(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                     int32_t key_hash, int64_t phy_offset, int64_t store_timestamp)
    int rs_index_put_batch(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                           const int32_t *key_hashes, const int64_t *phy_offsets,
                           const int64_t *store_timestamps, size_t n, int64_t *count)
    int rs_index_keys(const uint8_t *buf, size_t len, const rs_scan_rec *rows, size_t nrows,
                      int32_t *out_hashes, int32_t *out_rows, size_t cap, size_t *count,
                      size_t *rows_done)
    const int RS_INDEX_STOP_NONE
    const int RS_INDEX_STOP_FULL
    const int RS_INDEX_STOP_ROOM
    int rs_index_dispatch(uint8_t *ibuf, size_t ilen, int32_t slot_num, int32_t index_num,
                          int64_t limit, const uint8_t *buf, size_t len,
                          const rs_scan_rec *rows, size_t nrows, size_t *row, size_t *skip,
                          int32_t *stop)
    int rs_index_lookup(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                        int32_t key_hash, int64_t begin, int64_t end,
                        int64_t *out, int64_t cap, int64_t *count)

    # rs_sync.h
    int rs_sync_range(const uint8_t *buf, size_t len, int64_t start, int64_t length)

    # rs_batch.h
    int rs_batch_encode(uint8_t *out, size_t out_len, int64_t pos, int64_t limit,
                        const uint8_t *topic, size_t topic_len, int32_t queue_id,
                        const uint8_t *bodies, size_t bodies_len, const int64_t *body_off,
                        const uint8_t *a, size_t a_len, const int64_t *a_off,
                        const uint8_t *b, size_t b_len, const int64_t *b_off,
                        const uint8_t *frags, size_t frags_len, const int64_t *frag_off,
                        int64_t first, int64_t n,
                        int32_t flag, int32_t sys_flag, int64_t born_timestamp,
                        const uint8_t *born_host, size_t born_host_len,
                        int64_t store_timestamp, const uint8_t *store_host,
                        size_t store_host_len, int64_t queue_offset, int64_t phy_base,
                        int64_t *count, int64_t *nbytes)
