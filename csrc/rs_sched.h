/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_sched.h - delayed delivery: the records 4.9.8's messageTimeup builds from scheduled ones,
 * encoded in bulk (doc/01 §4; rocketstore/services/schedule.py holds the rules and the
 * reference path every record this kernel declines goes through).
 */
#ifndef RS_SCHED_H
#define RS_SCHED_H

#include "rs_common.h"
#include "rs_format.h"

/* rs_timeup_encode stop reasons. */
#define RS_TIMEUP_DONE 0     /* every record of [first, n) encoded */
#define RS_TIMEUP_SLOW 1     /* record *done is not the common case: the caller's path */
#define RS_TIMEUP_TOPIC 2    /* record *done's REAL_TOPIC is not in the topic table */
#define RS_TIMEUP_FULL 3     /* out has no room for record *done */

/* Most properties a record may carry here: a HashMap of up to 8 entries keeps its first 16
 * buckets and never treeifies, so its order is (bucket, insertion index). */
#define RS_TIMEUP_MAX_PROPS 8

/*
 * rs_timeup_encode - encode, at out[*out_bytes, out_len), the delivered record of each scheduled
 * record i in [first, n): the record at src[rec_pos[i], rec_pos[i] + rec_size[i]).
 *
 * The delivered record: topic REAL_TOPIC, queue REAL_QID, body, flag, sysFlag, born time and
 * host, store host and reconsume times of the scheduled record, prepared offset 0, queue
 * offset, physical offset and store time 0 (the append patches them), and the properties
 * string re-written in HashMap order with every parsed pair kept (DELAY, REAL_TOPIC, REAL_QID
 * stay).  Only the common case is done: a well-formed v1/v2 record of exactly rec_size bytes,
 * ASCII properties of at most RS_TIMEUP_MAX_PROPS distinct names, REAL_QID a Java int in
 * [0, 2^31), a transaction type that is dispatched, a body of at most max_body bytes and a
 * record plus the end-of-file blank of at most max_record bytes.  Any other record stops the
 * loop with RS_TIMEUP_SLOW at it.
 *
 * REAL_TOPIC must be one of the n_topics names topics[topic_off[k], topic_off[k + 1]) (names the
 * caller validated); out_key[i] = k << 32 | queue id.  An unknown one stops the loop with
 * RS_TIMEUP_TOPIC and its place in src at topic_at[0], its length at topic_at[1].
 * out_size[i] is the record's size.  *done is the index the loop stopped at (n when DONE) and
 * *out_bytes advances past every record written.
 * Returns a stop reason, or RS_E_ARG / RS_E_BOUNDS for arguments out of their domain.
 * GIL: callable without it.
 * Java: ScheduleMessageService.DeliverDelayedMessageTimerTask#messageTimeup (4.9.8).
 */
int rs_timeup_encode(const uint8_t *src, size_t src_len,
                     const int64_t *rec_pos, const int32_t *rec_size, int64_t first, int64_t n,
                     const uint8_t *topics, size_t topics_len,
                     const int64_t *topic_off, int64_t n_topics,
                     int64_t max_body, int64_t max_record,
                     uint8_t *out, size_t out_len,
                     int32_t *out_size, int64_t *out_key,
                     int64_t *done, int64_t *out_bytes, int64_t *topic_at);

#endif /* RS_SCHED_H */
