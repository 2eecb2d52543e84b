/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rs_index.h - IndexFile hash slots and entry chains (doc/02 §2; layout in rs_format.h).
 *
 * Every kernel takes the whole mapped file as buf and the file's geometry (slot_num slots,
 * index_num entries).  buf must hold at least RS_INDEX_HEADER_SIZE + slot_num * 4 +
 * index_num * 20 bytes, else RS_E_BOUNDS; slot_num or index_num < 1 is RS_E_ARG.  The header
 * in buf is the only state: Java's IndexHeader writes every setter through to the mapping,
 * so reading it back gives the same values.
 */
#ifndef RS_INDEX_H
#define RS_INDEX_H

#include "rs_common.h"
#include "rs_format.h"

/*
 * rs_index_hash - IndexFile#indexKeyHashMethod: abs(String.hashCode) of the UTF-8 key
 * buf[0, len), with Integer.MIN_VALUE (whose Math.abs is still negative) mapped to 0.
 * Returns RS_OK and the hash (>= 0) in *hash.
 * GIL: O(len) but keys are short; wrappers keep it.
 * Java: IndexFile#indexKeyHashMethod over IndexService#buildKey(topic, key).
 */
int rs_index_hash(const uint8_t *buf, size_t len, int32_t *hash);

/*
 * rs_index_key_hash - rs_index_hash of the key IndexService#buildKey makes, topic + "#" + key,
 * from the UTF-8 topic and key apart (each whole UTF-8 text), so a query builds no string.
 * Returns RS_OK and the hash (>= 0) in *hash.
 * GIL: keys are short; wrappers keep it.
 */
int rs_index_key_hash(const uint8_t *topic, size_t topic_len, const uint8_t *key,
                      size_t key_len, int32_t *hash);

/*
 * rs_index_keys - the keys IndexService#buildIndex puts for scanned records: for each row i of
 * rows[0, nrows) (commitlog_scan output over buf) that is not a ROLLBACK record, the index hash
 * of topic#UNIQ_KEY (if the properties hold a non-empty UNIQ_KEY) and then of topic#piece for
 * each non-empty piece of KEYS split on single spaces; the last valid segment of a name wins,
 * as string2messageProperties reads them.  out_hashes[k] / out_rows[k] receive the hash and
 * its row.  A row's keys are written all or none: when the next row's would pass cap, stop.
 * Returns RS_OK with *count keys and *rows_done rows consumed (< nrows: call again with more
 * room), or RS_E_BOUNDS if a row's topic or properties lie outside buf.
 * GIL: grows with nrows; wrappers release it.
 * Java: IndexService#buildIndex + buildKey over DispatchRequest keys/uniqKey.
 */
int rs_index_keys(const uint8_t *buf, size_t len, const rs_scan_rec *rows, size_t nrows,
                  int32_t *out_hashes, int32_t *out_rows, size_t cap, size_t *count,
                  size_t *rows_done);

/*
 * rs_index_put - IndexFile#putKey: append one entry for key_hash (>= 0, else RS_E_ARG),
 * link it at the head of its slot's chain and update the header (first-entry begin fields,
 * hashSlotCount, indexCount, end fields).  timeDiff is in seconds from the header's
 * beginTimestamp as it is *before* this put (so a rolled file's first entry is relative to
 * the pre-seeded previous end), 0 when beginTimestamp <= 0, clamped to [0, INT32_MAX].
 * Returns the new indexCount (>= 2), or 0 when the file is full (indexCount >= index_num),
 * writing nothing.
 * GIL: fixed work, wrappers keep it.
 */
int rs_index_put(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                 int32_t key_hash, int64_t phy_offset, int64_t store_timestamp);

/*
 * rs_index_put_batch - rs_index_put for keys 0..n-1 in order, stopping at the first that does
 * not fit.  Returns RS_OK with *count = keys put (< n means the file filled up; the caller
 * rolls to a new file and continues at key *count), or RS_E_ARG / RS_E_BOUNDS before any
 * write if a hash is negative or the geometry does not fit buf.
 * GIL: grows with n; wrappers release it.
 * Java: IndexService#buildIndex's putKey loop over UNIQ_KEY and each KEYS piece.
 */
int rs_index_put_batch(uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                       const int32_t *key_hashes, const int64_t *phy_offsets,
                       const int64_t *store_timestamps, size_t n, int64_t *count);

/* Why rs_index_dispatch stopped before the last row. */
#define RS_INDEX_STOP_NONE 0      /* every row dispatched */
#define RS_INDEX_STOP_FULL 1      /* the file is full: roll, then call again */
#define RS_INDEX_STOP_ROOM 2      /* the next entry lies past `limit`: reserve, then call again */

/*
 * rs_index_dispatch - IndexService#buildIndex over scanned rows, into one index file: for each
 * row of rows[*row, nrows) (commitlog_scan output over buf) that is not a ROLLBACK record, put
 * topic#UNIQ_KEY (if the properties hold a non-empty one) and then topic#piece for each
 * non-empty piece of KEYS split on single spaces (the keys rs_index_keys hashes, in its order),
 * each with rs_index_put's bytes, at the row's phyOffset and storeTimestamp.  The first *skip
 * keys of row *row are not put (already in the file).  ibuf/ilen is the whole index file of
 * slot_num slots and index_num entries; no entry is written whose end lies past `limit` (the
 * file's reserved blocks).
 * Stops before a row when the file is full (a full file rolls at the next record, whatever it
 * holds), and before a key when the file is full or the key's entry would pass `limit`: then
 * *row / *skip say where to go on (the row, and how many of its keys are in) and *stop is
 * RS_INDEX_STOP_FULL or RS_INDEX_STOP_ROOM.  Else *row = nrows, *skip = 0 and *stop =
 * RS_INDEX_STOP_NONE.  Returns RS_OK; RS_E_ARG / RS_E_BOUNDS, before any write, for a bad
 * geometry, *row > nrows, a negative limit, or a row whose topic or properties lie outside buf.
 * GIL: grows with nrows; wrappers release it.
 * Java: CommitLogDispatcherBuildIndex -> IndexService#buildIndex, putKey per key.
 */
int rs_index_dispatch(uint8_t *ibuf, size_t ilen, int32_t slot_num, int32_t index_num,
                      int64_t limit, const uint8_t *buf, size_t len, const rs_scan_rec *rows,
                      size_t nrows, size_t *row, size_t *skip, int32_t *stop);

/*
 * rs_index_lookup - IndexFile#selectPhyOffset: walk key_hash's slot chain newest-first and
 * write to out[0, cap) the phyOffset of each entry whose keyHash equals key_hash and whose
 * time (beginTimestamp + timeDiff * 1000) lies in [begin, end].  Stops at cap results, at a
 * negative timeDiff, at a prevIndex <= 0, > indexCount, >= index_num or equal to itself, at
 * an entry older than begin, and after index_num hops, so a corrupt chain that loops ends.
 * An out-of-range slot value (<= 0, > indexCount, >= index_num) or indexCount <= 1 gives 0
 * results.  Returns RS_OK with *count.
 * GIL: walks up to index_num entries; wrappers release it.
 */
int rs_index_lookup(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                    int32_t key_hash, int64_t begin, int64_t end,
                    int64_t *out, int64_t cap, int64_t *count);

/*
 * rs_index_walk - rs_index_lookup that can go on where it stopped, so a caller that throws
 * hits out (hash collisions, records outside the time range) walks each chain once.
 * *at is where to start: 0 for key_hash's slot, an entry number to resume, < 0 when the walk
 * is over (nothing is read).  *hops counts the hops of earlier calls (0 to start).  On return
 * *at is the entry the next call starts from, or -1 when the chain ended (by any of
 * rs_index_lookup's stops: they bound the hops over all calls together), and *hops the hops
 * so far.  Returns RS_OK with *count results; RS_E_ARG for a negative key_hash or *hops.
 * GIL: walks up to index_num entries over all calls; wrappers keep it for one query's few hops.
 * Java: IndexFile#selectPhyOffset.
 */
int rs_index_walk(const uint8_t *buf, size_t len, int32_t slot_num, int32_t index_num,
                  int32_t key_hash, int64_t begin, int64_t end, int32_t *at, int64_t *hops,
                  int64_t *out, int64_t cap, int64_t *count);

/* The most chains one rs_index_walk_chains call walks. */
#define RS_INDEX_MAX_CHAINS 8

/*
 * rs_index_chain - one index file's chain in rs_index_walk_chains: the file (buf, len,
 * slot_num, index_num), where its walk stands (at, hops: rs_index_walk's *at and *hops,
 * updated the same way), and room for its offsets (out[0, cap)); count is set to how many
 * were written there.
 */
typedef struct rs_index_chain {
    const uint8_t *buf;
    size_t len;
    int32_t slot_num;
    int32_t index_num;
    int32_t at;
    int64_t hops;
    int64_t *out;
    int64_t cap;
    int64_t count;
} rs_index_chain;

/*
 * rs_index_walk_chains - rs_index_walk of key_hash's chain in each of n index files at once,
 * a hop of every chain a step, so that their loads overlap: a chain walk is a run of
 * dependent loads, each a miss once the index outgrows the caches, and a key query walks
 * the chain of every file its window matches, newest first.  chains[i] ends as
 * rs_index_walk alone would leave it, except that it stops early, with at set to the entry
 * to resume from, once chains[0, i) together hold `want` offsets (a query wanting no more
 * has no use for it yet).  Each chain's offsets are a prefix of its own walk, so a caller
 * that takes chains[0]'s, resuming it with rs_index_walk while it wants more, then
 * chains[1]'s, and so on, sees exactly what walking the files one after another gives.
 * Returns RS_OK; RS_E_ARG for n > RS_INDEX_MAX_CHAINS or want < 1, and any chain's
 * rs_index_walk error (nothing is walked then).
 * GIL: walks up to index_num entries a chain over all calls; wrappers keep it.
 * Java: IndexService#queryOffset's walk over IndexFile#selectPhyOffset, file by file.
 */
int rs_index_walk_chains(rs_index_chain *chains, size_t n, int32_t key_hash, int64_t begin,
                         int64_t end, int64_t want);

/*
 * rs_index_has_key - the properties string props[0, props_len) carries key (non-empty) as its
 * UNIQ_KEY or as a piece of its KEYS split on single spaces, the values read as
 * rs_index_keys reads them (last valid segment of a name wins).  Bytes are compared, the
 * key as its UTF-8.  Returns 1 or 0.
 * GIL: O(props_len); callable without it.
 * Java: the key filter of MQAdminImpl#queryMessage (KEYS pieces) and of a unique-key query
 * (UNIQ_KEY); the broker's queryMessage compares nothing (doc/02 §2.6).
 */
int rs_index_has_key(const uint8_t *props, size_t props_len, const uint8_t *key,
                     size_t key_len);

/*
 * rs_index_match - the record at buf[pos, len) answers a query for key under topic: it is a
 * whole, valid record by rs_msg_check (no CRC check; len is the end of readable data), its
 * PHYSICALOFFSET is phy_offset (the index entry that led here points at its start), its
 * STORETIMESTAMP lies in [begin, end], its topic bytes equal topic, and rs_index_has_key.
 * A NULL topic or key is not compared: what a msgId lookup asks (the record at an offset).
 * Returns 1 with *size = TOTALSIZE, 0 (with *size = 0) when any of that fails (a damaged
 * record is an answer of 0, never an error), RS_E_BOUNDS when pos is outside [0, len].
 * GIL: O(record); callable without it.
 * Java: DefaultMessageStore#lookMessageByOffset + the client's key filter.
 */
int rs_index_match(const uint8_t *buf, size_t len, int64_t pos, int64_t phy_offset,
                   const uint8_t *topic, size_t topic_len, const uint8_t *key, size_t key_len,
                   int64_t begin, int64_t end, int32_t *size);

/*
 * rs_index_match_row - rs_index_match that also fills *row with rs_msg_check's row of the
 * record when it answers (1): the caller builds the message from the row instead of parsing
 * the record again.  *row is unspecified when the answer is not 1.
 * GIL: O(record); callable without it.
 */
int rs_index_match_row(const uint8_t *buf, size_t len, int64_t pos, int64_t phy_offset,
                       const uint8_t *topic, size_t topic_len, const uint8_t *key,
                       size_t key_len, int64_t begin, int64_t end, rs_scan_rec *row,
                       int32_t *size);

#endif /* RS_INDEX_H */
