/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_cq.h - 20-byte ConsumeQueue units (doc/02 §1.2; layout in rs_format.h).
 */
#ifndef RS_CQ_H
#define RS_CQ_H

#include "rs_common.h"
#include "rs_format.h"

/*
 * rs_cq_encode - write one unit (commitLogOffset, size, tagsCode) at out[pos, pos + 20).
 * Returns 20 or RS_E_BOUNDS.
 * GIL: fixed 20 bytes, cheaper than releasing it; wrappers keep it.
 * Java: ConsumeQueue#putMessagePositionInfo (the byteBufferIndex fill).
 */
int rs_cq_encode(uint8_t *out, size_t out_len, int64_t pos,
                 int64_t offset, int32_t size, int64_t tags_code);

/*
 * rs_cq_encode_batch - write n units from parallel arrays at out[pos, pos + 20 n).
 * Returns RS_OK with *nbytes = 20 n, or RS_E_BOUNDS (nothing written).
 * GIL: grows with n; wrappers release it.
 * Java: ConsumeQueue#putMessagePositionInfo, once per dispatched record.
 */
int rs_cq_encode_batch(uint8_t *out, size_t out_len, int64_t pos,
                       const int64_t *offsets, const int32_t *sizes, const int64_t *tags_codes,
                       size_t n, int64_t *nbytes);

/*
 * rs_cq_search - over the units in buf[start, end) (whole units only), the index relative to
 * start of the first unit whose commitLogOffset >= phy_offset, or the unit count if none.
 * The probe sequence is numpy.searchsorted(side="left")'s, so even an unsorted window gives the
 * reference backend's answer.  Returns RS_OK with *index, or RS_E_BOUNDS.
 * GIL: O(log n), keep it.
 * Java: the binary searches of ConsumeQueue#getOffsetInQueueByTime and 5.x correctMinOffset.
 */
int rs_cq_search(const uint8_t *buf, size_t len, int64_t start, int64_t end,
                 int64_t phy_offset, int64_t *index);

#endif /* RS_CQ_H */
