# SPDX-License-Identifier: Apache-2.0
"""Store configuration: RocketMQ 4.9.x `MessageStoreConfig` as a snake_case dataclass.

Every field of `org.apache.rocketmq.store.config.MessageStoreConfig` (4.9.x line) is here under
its snake_case name with the Java default, Java's spellings kept (`maped`, `hight`, `d_leger`).
A few rocketstore fields follow them; each says where its value lives in a Java broker.

`StoreConfig.from_properties` reads a real `broker.conf` (java.util.Properties syntax) the way
`BrokerStartup` + `MixAll.properties2Object` do, and `to_properties` writes one back.
"""
import dataclasses
import enum
import ipaddress
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from rocketstore.codec.java_properties import (decode_properties_bytes, format_property,
                                                parse_properties)
from rocketstore.errors import ConfigError
from rocketstore.format import CQ_STORE_UNIT_SIZE
from rocketstore.ha.wire import MAX_FRAME_BODY as HA_MAX_FRAME_BODY

log = logging.getLogger(__name__)

__all__ = [
    "BrokerRole",
    "FlushDiskType",
    "JAVA_KEYS",
    "StoreConfig",
    "camel_to_snake",
    "parse_delay_level",
    "parse_properties",
]


class FlushDiskType(enum.Enum):
    """When a put is acknowledged relative to fsync (doc/03 §2)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class BrokerRole(enum.Enum):
    """Replication role (doc/05 §1)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# ScheduleMessageService#parseDelayLevel's unit table; the unit letter is case-sensitive there.
_DELAY_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# Integer.parseInt / Long.parseLong accept an optional sign and digits, nothing else.
_JAVA_INT_RE = re.compile(r"[+-]?[0-9]+")


def _default_root_dir():
    # Java: System.getProperty("user.home") + File.separator + "store", evaluated per instance.
    return os.path.join(os.path.expanduser("~"), "store")


# MessageStoreConfig fields rocketstore carries (so a broker.conf round-trips) but does not
# implement. Set to anything but the Java default, each is refused: a setting that silently
# does nothing would mislead. The README's "Config fields not implemented" lists them.
# tests/test_config.py checks that no field here is read anywhere and every other field is.
_DLEDGER = "DLedger (Raft) CommitLogs are not supported"
_LMQ = "light message queues (LMQ) and multi-dispatch are not supported"
_CQ_EXT = "ConsumeQueue extension files (consumequeue_ext) are neither written nor read"
_NO_STATS = "the store keeps no such statistics yet"
_NO_ASYNC_SCHEDULE = "delayed messages are delivered synchronously"
NOT_IMPLEMENTED = {
    "store_path_d_ledger_commit_log": _DLEDGER,
    "read_only_commit_log_store_paths": "a multi-path (read-only extra) CommitLog is not "
                                        "supported",
    "enable_consume_queue_ext": _CQ_EXT,
    "mapped_file_size_consume_queue_ext": _CQ_EXT,
    "bit_map_length_consume_queue_ext": _CQ_EXT,
    "use_reentrant_lock_when_put_message": "the put lock is one kind of mutex; Java's choice "
                                           "between a spin and a reentrant lock has no "
                                           "counterpart",
    "put_msg_index_hight_water": "no back-pressure on the index backlog",
    "flush_least_pages_when_warm_maped_file": "files are warmed by MADV_POPULATE_WRITE in "
                                              "reserved windows, with no flush while warming",
    "max_transfer_bytes_on_message_in_memory": "get_message is bounded by its max_msg_nums "
                                               "and a fixed byte budget",
    "max_transfer_count_on_message_in_memory": "get_message is bounded by its max_msg_nums "
                                               "and a fixed byte budget",
    "max_transfer_bytes_on_message_in_disk": "get_message is bounded by its max_msg_nums and "
                                             "a fixed byte budget",
    "max_transfer_count_on_message_in_disk": "get_message is bounded by its max_msg_nums and "
                                             "a fixed byte budget",
    "debug_lock_enable": "there is no lock-debugging thread",
    "duplication_enable": "the confirm offset of duplicated (DLedger) stores is not kept",
    "disk_fall_recorded": _NO_STATS,
    "default_query_max_num": "query_message takes its max_num from the caller",
    "fast_fail_if_no_buffer_in_store_pool": "the transient pool never fails a put fast",
    "enable_d_leger_commit_log": _DLEDGER,
    "d_leger_group": _DLEDGER,
    "d_leger_peers": _DLEDGER,
    "d_leger_self_id": _DLEDGER,
    "preferred_leader_id": _DLEDGER,
    "enable_batch_push": "the HA master has no batch-push mode",
    "enable_schedule_message_stats": _NO_STATS,
    "enable_lmq": _LMQ,
    "enable_multi_dispatch": _LMQ,
    "max_lmq_consume_queue_num": _LMQ,
    "enable_schedule_async_deliver": _NO_ASYNC_SCHEDULE,
    "schedule_async_deliver_max_pending_limit": _NO_ASYNC_SCHEDULE,
    "schedule_async_deliver_max_resend_num2_blocked": _NO_ASYNC_SCHEDULE,
}

# Keys of 4.9.8's BrokerConfig, NettyServerConfig and NettyClientConfig: a broker.conf holds
# them beside the store's, so from_properties keeps them quietly (extra_properties) and warns
# only about a key that none of the three knows.
BROKER_KEYS = frozenset("""
aclEnable adminBrokerThreadPoolNums autoCreateSubscriptionGroup autoCreateTopicEnable
autoDeleteUnusedStats brokerClusterName brokerFastFailureEnable brokerIP1 brokerIP2 brokerId
brokerName brokerPermission brokerTopicEnable channelNotActiveInterval clientAsyncSemaphoreValue
clientCallbackExecutorThreads clientChannelMaxIdleTimeSeconds clientCloseSocketIfTimeout
clientManageThreadPoolNums clientManagerThreadPoolQueueCapacity clientOnewaySemaphoreValue
clientPooledByteBufAllocatorEnable clientSocketRcvBufSize clientSocketSndBufSize
clientWorkerThreads clusterTopicEnable commercialBaseCount commercialBigCount commercialEnable
commercialTimerCount commercialTransCount compressedRegister configBlackList
connectTimeoutMillis consumerFallbehindThreshold consumerManageThreadPoolNums
consumerManagerThreadPoolQueueCapacity defaultTopicQueueNums disableConsumeIfConsumerReadSlowly
enableCalcFilterBitMap enableDetailStat enablePropertyFilter endTransactionPoolQueueCapacity
endTransactionThreadPoolNums expectConsumerNumUseFilter fetchNamesrvAddrByAddressServer
filterDataCleanTimeSpan filterServerNums filterSupportRetry flushConsumerOffsetHistoryInterval
flushConsumerOffsetInterval forceRegister heartbeatThreadPoolNums
heartbeatThreadPoolQueueCapacity highSpeedMode isolateLogEnable listenPort longPollingEnable
maxDelayTime maxErrorRateOfBloomFilter messageStorePlugIn msgTraceTopicName namesrvAddr
notifyConsumerIdsChangedEnable processReplyMessageThreadPoolNums pullMessageThreadPoolNums
pullThreadPoolQueueCapacity putMessageFutureThreadPoolNums putThreadPoolQueueCapacity
queryMessageThreadPoolNums queryThreadPoolQueueCapacity regionId registerBrokerTimeoutMills
registerNameServerPeriod rejectTransactionMessage replyThreadPoolQueueCapacity rocketmqHome
sendMessageThreadPoolNums sendThreadPoolQueueCapacity serverAsyncSemaphoreValue
serverCallbackExecutorThreads serverChannelMaxIdleTimeSeconds serverOnewaySemaphoreValue
serverPooledByteBufAllocatorEnable serverSelectorThreads serverSocketBacklog
serverSocketRcvBufSize serverSocketSndBufSize serverWorkerThreads shortPollingTimeMills
slaveReadEnable startAcceptSendRequestTimeStamp storeReplyMessageEnable traceOn traceTopicEnable
transactionCheckInterval transactionCheckMax transactionTimeOut transferMsgByHeap
useEpollNativeSelector useTLS waitTimeMillsInHeartbeatQueue waitTimeMillsInPullQueue
waitTimeMillsInSendQueue waitTimeMillsInTransactionQueue writeBufferHighWaterMark
writeBufferLowWaterMark
""".split())

@dataclass
class StoreConfig:
    """Configuration of one message store.

    Fields up to `schedule_async_deliver_max_resend_num2_blocked` are MessageStoreConfig's, in
    Java declaration order; times are milliseconds unless the name says otherwise
    (`file_reserved_time` is hours). Java getters that derive a value are properties here:
    `cq_file_size`, `effective_disk_max_used_space_ratio`,
    `effective_transient_store_pool_enable`, `delay_levels`, `commitlog_dir()`.

    Construction validates types and ranges and raises `ConfigError` naming the field;
    enum fields also accept their names as strings.
    """

    # --- paths ---
    store_path_root_dir: str = field(default_factory=_default_root_dir)
    store_path_commit_log: Optional[str] = None          # None: <root>/commitlog (commitlog_dir)
    store_path_d_ledger_commit_log: Optional[str] = None
    read_only_commit_log_store_paths: Optional[str] = None
    # --- file sizes ---
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CQ_STORE_UNIT_SIZE  # read via cq_file_size
    enable_consume_queue_ext: bool = False
    mapped_file_size_consume_queue_ext: int = 48 * 1024 * 1024
    bit_map_length_consume_queue_ext: int = 64
    # --- flush / commit services ---
    flush_interval_commit_log: int = 500
    commit_interval_commit_log: int = 200
    use_reentrant_lock_when_put_message: bool = True
    flush_commit_log_timed: bool = True
    flush_interval_consume_queue: int = 1000
    # --- cleaning ---
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_maped_file_interval_forcibly: int = 120_000
    redelete_hanged_file_interval: int = 120_000
    delete_when: str = "04"                              # ';'-separated local hours
    disk_max_used_space_ratio: int = 75     # read via effective_disk_max_used_space_ratio
    file_reserved_time: int = 72                         # hours
    put_msg_index_hight_water: int = 600_000
    max_message_size: int = 4 * 1024 * 1024
    check_crc_on_recover: bool = True
    flush_commit_log_least_pages: int = 4
    commit_commit_log_least_pages: int = 4
    flush_least_pages_when_warm_maped_file: int = 1024 // 4 * 16
    flush_consume_queue_least_pages: int = 2
    flush_commit_log_thorough_interval: int = 10_000
    commit_commit_log_thorough_interval: int = 200
    flush_consume_queue_thorough_interval: int = 60_000
    # --- reads ---
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    # --- index ---
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    max_msgs_num_batch: int = 64
    message_index_safe: bool = False
    # --- HA ---
    ha_listen_port: int = 10912
    ha_send_heartbeat_interval: int = 5000
    ha_housekeeping_interval: int = 20_000
    # Most body bytes per master->slave frame. 4.9.x's default is 32 KiB; ours is the largest
    # frame a 4.9.x slave takes (its 4 MiB read buffer less the 12-byte header): fewer frames,
    # fewer offset reports, and the slave receives each body straight into its mapping.
    ha_transfer_batch_size: int = HA_MAX_FRAME_BODY
    ha_master_address: Optional[str] = None              # "host:port" of the master, on a slave
    ha_slave_fallbehind_max: int = 256 * 1024 * 1024
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    sync_flush_timeout: int = 5000
    slave_timeout: int = 3000
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    flush_delay_offset_interval: int = 10_000            # Java long
    clean_file_forcibly_enable: bool = True
    warm_maped_file_enable: bool = False
    offset_check_in_slave: bool = False
    debug_lock_enable: bool = False
    duplication_enable: bool = False
    disk_fall_recorded: bool = True
    os_page_cache_busy_time_out_mills: int = 1000        # Java long
    default_query_max_num: int = 32
    # --- TransientStorePool ---
    transient_store_pool_enable: bool = False   # via effective_transient_store_pool_enable
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    # --- DLedger and later 4.9.x additions (carried for round trips; rocketstore ignores them) ---
    enable_d_leger_commit_log: bool = False
    d_leger_group: Optional[str] = None
    d_leger_peers: Optional[str] = None
    d_leger_self_id: Optional[str] = None
    preferred_leader_id: Optional[str] = None
    enable_batch_push: bool = False                      # Java field `isEnableBatchPush`
    enable_schedule_message_stats: bool = True
    enable_lmq: bool = False
    enable_multi_dispatch: bool = False
    max_lmq_consume_queue_num: int = 20_000
    enable_schedule_async_deliver: bool = False
    schedule_async_deliver_max_pending_limit: int = 2000
    schedule_async_deliver_max_resend_num2_blocked: int = 3

    # --- rocketstore fields ---
    # 4.9.x reads these two from system properties rocketmq.broker.diskSpaceWarningLevelRatio and
    # rocketmq.broker.diskSpaceCleanForciblyRatio (fractions); 5.x made them config keys (percent).
    disk_space_warning_level_ratio: float = 0.90
    disk_space_clean_forcibly_ratio: float = 0.85
    # 4.9.x constant DELETE_FILES_BATCH_MAX; a config key (deleteFileBatchMax) in 5.x.
    delete_file_batch_max: int = 10
    # The broker's own address, written into every record's STOREHOST. Java takes it from
    # BrokerConfig.brokerIP1 and NettyServerConfig.listenPort.
    store_host: tuple = ("127.0.0.1", 10911)
    # Interface the HA listener binds; a Java master binds every interface (doc/05).
    ha_bind_address: str = "127.0.0.1"
    # Whether an ASYNC_MASTER opens its HA port. A broker always does; an embedded store
    # should not open a TCP port unless asked (`rocketstore serve` asks). A SYNC_MASTER always
    # listens: its puts wait for a slave.
    ha_listen: bool = False
    # Most slave connections a master keeps at once; more are closed on accept. Each costs two
    # threads and a 1 MiB read buffer, and 4.9.x has no cap (a port scan could exhaust it).
    ha_max_connections: int = 16
    # Create the next CommitLog file ahead of time and pre-fault the reserved window of the
    # file being written (AllocateMappedFileService).
    prefault_next_file: bool = True
    # Files are sparse; blocks are reserved (posix_fallocate) this many bytes ahead of the
    # writer, so a full disk refuses a put instead of killing the process with SIGBUS, and
    # disk and memory grow with the data. A queue's window is small because a broker may
    # hold thousands of queues. (Index files reserve their header and slot table whole when
    # created, and entries 64 KiB ahead.)
    commit_log_reserve_window: int = 16 * 1024 * 1024
    consume_queue_reserve_window: int = 16 * 1024
    # Beyond RocketMQ (no Java key): keep a CommitLog file while a committed consumer offset
    # still needs it, unless disk usage passes disk_space_clean_forcibly_ratio.
    clean_protect_unconsumed: bool = False
    # Beyond RocketMQ (no Java key): the most bytes the store's files (CommitLog, ConsumeQueues,
    # index) may take on disk, counted as allocated blocks; 0 = no budget. Past it, cleaning
    # deletes the oldest CommitLog files, and the queue and index files they alone cover,
    # expired or not (an embedded store shares its disk with its application). With a budget,
    # the first cleaning round comes after clean_resource_interval, not a minute after start.
    store_size_budget: int = 0
    # Beyond RocketMQ (no Java key): evict the page cache of CommitLog bytes that are flushed
    # and farther behind its end than access_message_in_memory_max_ratio of the machine's
    # memory, where RocketMQ's reads count a message as on disk already (doc/01 §6). Their
    # memory is then free for the pages the writer needs next, at once. Left to the kernel,
    # the page cache first grows into memory long free, which a VM may have handed back to
    # its host (on the 2-core VM, filling such memory ran at 1 GB/s, memory freed a moment
    # before at 8 GB/s), and later takes each page from reclaim. Off: the kernel alone
    # decides, as for a Java broker.
    drop_cold_commit_log_cache: bool = True
    # Beyond RocketMQ (no Java key): every put wakes the reput service, so its ConsumeQueue
    # unit is written at once rather than at reput's next 1 ms cycle. A store does this by
    # itself while a consumer in its own process waits; readers in other processes
    # (LiveReader) cannot ask for it, so the writer opts in. Costs a wake-up per put.
    wake_reput_on_put: bool = False
    # Beyond RocketMQ (no Java key): on a master, a put_messages or put_batch call that finds
    # the reput thread more than this many bytes behind the CommitLog dispatches up to its
    # end (ConsumeQueue units, index keys) in the putting thread before it returns (doc/03
    # §8). The reput thread needs the GIL between its passes, which a busy writer holds for
    # up to the 5 ms switch interval at a time; on a loaded machine it may get no core at
    # all: the queues then never lag further than this behind the writer. 0: every batch
    # put dispatches what it wrote; negative: never.
    dispatch_in_put_lag: int = 0
    # Beyond RocketMQ's store (a producer's settings, DefaultMQProducer): compress each put's
    # body as a 4.9 producer does before sending it (doc/01 §3.5). A body of at least
    # compress_msg_body_over_howmuch bytes is stored zlib-deflated at compress_level (the
    # client's rocketmq.client.compress.level) with COMPRESSED_FLAG set; a broker batch
    # (put_messages with batch_properties) is not, as the client never compresses a
    # MessageBatch. Off by default: a broker stores what it receives.
    compress_msg_body: bool = False
    compress_msg_body_over_howmuch: int = 4096
    compress_level: int = 5
    # Keys of a broker.conf that are not store fields (brokerName, namesrvAddr, ...), kept so
    # to_properties() writes them back.
    extra_properties: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            setattr(self, f.name, _check_field(f.name, getattr(self, f.name)))
        self._check_semantics()

    def _check_semantics(self):
        for name, why in NOT_IMPLEMENTED.items():
            value = getattr(self, name)
            if value != _FIELD_DEFAULTS[name]:
                raise ConfigError(
                    f"{_label(name)} = {value!r} is not implemented by rocketstore ({why}); "
                    f"leave it at its default {_FIELD_DEFAULTS[name]!r}")
        for name in _POSITIVE_FIELDS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{_label(name)} must be > 0, got {getattr(self, name)}")
        for name in ("commit_log_reserve_window", "consume_queue_reserve_window",
                     "store_size_budget"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_label(name)} must be >= 0, got {getattr(self, name)}")
        if self.compress_msg_body_over_howmuch < 0:
            raise ConfigError(f"{_label('compress_msg_body_over_howmuch')} must be >= 0, got "
                              f"{self.compress_msg_body_over_howmuch}")
        if not -1 <= self.compress_level <= 9:
            # java.util.zip.Deflater's levels (-1: zlib's default)
            raise ConfigError(f"{_label('compress_level')} must be -1..9 (a zlib level), got "
                              f"{self.compress_level}")
        if self.cq_file_size > _INT32_MAX:
            raise ConfigError(f"{_label('mapped_file_size_consume_queue')} rounds up to "
                              f"{self.cq_file_size}, past Java's int range")
        if not 0 < self.ha_transfer_batch_size <= HA_MAX_FRAME_BODY:
            # A larger frame never completes in a 4.9.x slave's 4 MiB read buffer: it stalls.
            raise ConfigError(f"{_label('ha_transfer_batch_size')} must be 1..{HA_MAX_FRAME_BODY}"
                              f" (what a 4.9 slave's read buffer holds), got "
                              f"{self.ha_transfer_batch_size}")
        if not 0 <= self.ha_listen_port <= 65535:
            raise ConfigError(f"{_label('ha_listen_port')} must be a port (0..65535), "
                              f"got {self.ha_listen_port}")
        for name in ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{_label(name)} must be a fraction in (0, 1], got {value}")
        # UtilAll.isItTimeToDo runs Integer.parseInt on each hour; a bad entry would only
        # surface in the clean thread, so reject it here.
        for hour in _java_split(self.delete_when, ";"):
            if not _JAVA_INT_RE.fullmatch(hour):
                raise ConfigError(f"{_label('delete_when')}: {hour!r} in "
                                  f"{self.delete_when!r} is not an hour")
        try:
            parse_delay_level(self.message_delay_level)
        except ValueError as exc:
            raise ConfigError(f"{_label('message_delay_level')}: {exc}") from None

    # --- derived values (Java getters with logic) ---

    @property
    def cq_file_size(self):
        """ConsumeQueue file size as Java's getter returns it: rounded up to a multiple of 20."""
        units = math.ceil(self.mapped_file_size_consume_queue / CQ_STORE_UNIT_SIZE)
        return units * CQ_STORE_UNIT_SIZE

    @property
    def effective_disk_max_used_space_ratio(self):
        """`disk_max_used_space_ratio` clamped to 10..95 (percent), as Java's getter does."""
        return min(max(self.disk_max_used_space_ratio, 10), 95)

    @property
    def effective_transient_store_pool_enable(self):
        """Whether the TransientStorePool is used: Java's getter also requires ASYNC_FLUSH and
        a master."""
        return (self.transient_store_pool_enable
                and self.flush_disk_type is FlushDiskType.ASYNC_FLUSH
                and self.broker_role is not BrokerRole.SLAVE)

    @property
    def delay_levels(self):
        """Delay of each level in milliseconds; level 1 is index 0."""
        return parse_delay_level(self.message_delay_level)

    @property
    def max_delay_level(self):
        """Highest delay level (18 with the default `message_delay_level`)."""
        return len(self.delay_levels)

    def commitlog_dir(self, root=None):
        """CommitLog directory: `store_path_commit_log`, else `<root>/commitlog`.

        `root` defaults to `store_path_root_dir`. A multi-path value (',' separated in 4.9.x)
        is returned as written.
        """
        if self.store_path_commit_log is not None:
            return self.store_path_commit_log
        return os.path.join(self.store_path_root_dir if root is None else root, "commitlog")

    # --- broker.conf ---

    @classmethod
    def from_properties(cls, source, **overrides):
        """Build a config from a broker.conf.

        `source` is a path (`os.PathLike`, or a one-line `str` without '='), the text of a
        properties file (any `str` with a newline or '='), or a mapping of keys to values.
        Keys are Java's camelCase names (snake_case field names are accepted too);
        `brokerIP1` and `listenPort` set `store_host`, and `listenPort` also sets
        `ha_listen_port` to listenPort + 1 unless `haListenPort` is given. Other keys land in
        `extra_properties`. `overrides` (field names, Python values) are applied last.
        """
        props = _read_source(source)
        kwargs, extra = {}, {}
        host, port = None, None
        for key, raw in props.items():
            if key == "brokerIP1":
                host = raw.strip() if isinstance(raw, str) else raw
                _check_ip("brokerIP1 (store_host)", host)
            elif key == "listenPort":
                port = _convert("store_host", key, raw, int)
            else:
                name = _KEY_ALIASES.get(key) or camel_to_snake(key)
                if name in _FROM_PROPERTIES:
                    kwargs[name] = _convert(name, key, raw, _KIND[name])
                else:
                    if key not in BROKER_KEYS:
                        log.warning("broker.conf key %r is no setting of a 4.9.8 store, "
                                    "broker or netty server/client: ignored", key)
                    extra[key] = raw
        if host is not None or port is not None:
            default_host, default_port = _FIELD_DEFAULTS["store_host"]
            kwargs["store_host"] = (default_host if host is None else host,
                                    default_port if port is None else port)
            # BrokerStartup derives the HA port from the remoting port.
            if port is not None and "ha_listen_port" not in kwargs and isinstance(port, int):
                kwargs["ha_listen_port"] = port + 1
        kwargs["extra_properties"] = extra
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_properties(self):
        """Render as broker.conf text with Java keys; `from_properties` reads it back equal.

        None-valued fields are left out (Properties has no null); `store_host` becomes
        `brokerIP1` + `listenPort`; `extra_properties` follow the store fields.
        """
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra_properties" or value is None:
                continue
            if f.name == "store_host":
                lines.append(format_property("brokerIP1", value[0]))
                lines.append(format_property("listenPort", str(value[1])))
                continue
            lines.append(format_property(JAVA_KEYS[f.name], _format_value(value)))
        for key, value in self.extra_properties.items():
            lines.append(format_property(str(key), _format_value(value)))
        return "\n".join(lines) + "\n"


# --- field tables, built once from the dataclass ---

_FIELDS = {f.name: f for f in dataclasses.fields(StoreConfig)}
_FIELD_DEFAULTS = {f.name: f.default for f in _FIELDS.values()
                   if f.default is not dataclasses.MISSING}
_KIND = {
    name: {int: int, bool: bool, float: float, str: str, Optional[str]: Optional[str],
           FlushDiskType: FlushDiskType, BrokerRole: BrokerRole, tuple: tuple, dict: dict}[f.type]
    for name, f in _FIELDS.items()
}
# Java `long` fields; every other integer field is a Java `int`.
_LONG_FIELDS = frozenset({"flush_delay_offset_interval", "os_page_cache_busy_time_out_mills",
                          "store_size_budget"})
# Sizes the file formats divide by or allocate; Java does not check them, but zero or negative
# values only fail later, deep inside a MappedFile or IndexFile.
_POSITIVE_FIELDS = (
    "mapped_file_size_commit_log", "mapped_file_size_consume_queue",
    "mapped_file_size_consume_queue_ext", "max_message_size", "max_hash_slot_num", "max_index_num",
    "ha_max_connections",
)
# Fields whose Java key the generic snake→camel rule gets wrong.
_JAVA_KEY_OVERRIDES = {"check_crc_on_recover": "checkCRCOnRecover"}
# Keys the generic camel→snake rule does not map: Java's field name where it differs from the
# setter-derived key (MixAll.object2Properties writes field names), and the 5.x rename.
_KEY_ALIASES = {
    "isEnableBatchPush": "enable_batch_push",
    "haMaxGapNotInSync": "ha_slave_fallbehind_max",
}
# store_host comes from brokerIP1/listenPort, extra_properties from the leftovers.
_FROM_PROPERTIES = frozenset(_FIELDS) - {"store_host", "extra_properties"}


def camel_to_snake(key):
    """`checkCRCOnRecover` → `check_crc_on_recover`; snake_case input comes back unchanged."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", key)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()


def _snake_to_camel(name):
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


JAVA_KEYS = {name: _JAVA_KEY_OVERRIDES.get(name) or _snake_to_camel(name)
             for name in _FIELDS if name not in ("store_host", "extra_properties")}
"""Field name → broker.conf key (Java's setter-derived property name)."""


def _label(name):
    key = JAVA_KEYS.get(name)
    return f"{name} ({key})" if key and key != name else name


def _check_field(name, value):
    """Type- and range-check one field value; return it normalised (enum, tuple, float)."""
    kind = _KIND[name]
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{_label(name)} must be a bool, got {value!r}")
    elif kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{_label(name)} must be an int, got {value!r}")
        lo, hi = (_INT64_MIN, _INT64_MAX) if name in _LONG_FIELDS else (_INT32_MIN, _INT32_MAX)
        if not lo <= value <= hi:
            java = "long" if name in _LONG_FIELDS else "int"
            raise ConfigError(f"{_label(name)} = {value} does not fit a Java {java}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{_label(name)} must be a number, got {value!r}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{_label(name)} must be a str, got {value!r}")
    elif kind == Optional[str]:
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{_label(name)} must be a str or None, got {value!r}")
    elif kind in (FlushDiskType, BrokerRole):
        if isinstance(value, str):
            try:
                value = kind[value.strip().upper()]
            except KeyError:
                names = ", ".join(m.name for m in kind)
                raise ConfigError(f"{_label(name)} must be one of {names}, got {value!r}") from None
        elif not isinstance(value, kind):
            raise ConfigError(f"{_label(name)} must be a {kind.__name__}, got {value!r}")
    elif kind is tuple:
        value = _check_host(name, value)
    elif kind is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a dict, got {value!r}")
    if name == "ha_bind_address":
        _check_ip(name, value)
    return value


def _check_ip(name, host):
    try:
        ipaddress.ip_address(host)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {host!r} is not an IPv4 or IPv6 address literal") from None


def _check_host(name, value):
    # STOREHOST is 4 or 16 address bytes plus a port in every record, so only literals will do.
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigError(f"{name} must be a (host, port) tuple, got {value!r}")
    host, port = value
    if not isinstance(host, str):
        raise ConfigError(f"{name}: host must be a str, got {host!r}")
    _check_ip(name, host)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"{name}: port must be an int in 0..65535, got {port!r}")
    return (host, port)


def _java_split(text, sep):
    """String.split with a literal separator: trailing empty pieces are dropped."""
    if text == "":
        return [""]     # Java: "".split(x) is [""], which parseInt then rejects
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def parse_delay_level(text):
    """Parse a `messageDelayLevel` string into milliseconds per level (level 1 first).

    Follows ScheduleMessageService#parseDelayLevel: levels separated by single spaces, each a
    number followed by one of s, m, h, d. Raises ValueError where Java would fail to start.
    """
    levels = []
    for i, token in enumerate(_java_split(text, " ")):
        unit = _DELAY_UNIT_MS.get(token[-1:])
        number = token[:-1]
        if unit is None or not _JAVA_INT_RE.fullmatch(number):
            raise ValueError(f"level {i + 1}: {token!r} is not <number><s|m|h|d>")
        levels.append(int(number) * unit)
    return levels


def _read_source(source):
    if isinstance(source, Mapping):
        return {str(k): v for k, v in source.items()}
    if isinstance(source, str) and ("\n" in source or "\r" in source or "=" in source):
        return parse_properties(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as fh:
            data = fh.read()
        return parse_properties(decode_properties_bytes(data))
    raise TypeError(f"from_properties takes a path, properties text or a mapping, "
                    f"not {type(source).__name__}")


def _format_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    return str(value)


def _convert(name, key, raw, kind):
    """Convert one broker.conf string to the field's Python type; non-strings pass through."""
    if not isinstance(raw, str):
        return raw
    # Properties keeps trailing whitespace, where Integer.parseInt would fail and Java would
    # silently keep the default; trimming is kinder and loses nothing.
    s = raw.strip()
    where = f"{key} ({name})" if key != name else key
    if kind is int:
        if not _JAVA_INT_RE.fullmatch(s):
            raise ConfigError(f"{where}: {raw!r} is not an integer")
        return int(s)
    if kind is bool:
        # Boolean.parseBoolean reads anything but "true" as false; a typo should not do that.
        if s.lower() not in ("true", "false"):
            raise ConfigError(f"{where}: {raw!r} is not true or false")
        return s.lower() == "true"
    if kind is float:
        try:
            value = float(s)
        except ValueError:
            raise ConfigError(f"{where}: {raw!r} is not a number") from None
        # 5.x writes the disk ratios as percentages (90), 4.9.x as fractions (0.90).
        if name in ("disk_space_warning_level_ratio", "disk_space_clean_forcibly_ratio") and \
                value > 1:
            value /= 100.0
        return value
    if kind in (FlushDiskType, BrokerRole):
        if s.upper() not in kind.__members__:
            names = ", ".join(kind.__members__)
            raise ConfigError(f"{where}: {raw!r} is not one of {names}")
        return kind[s.upper()]
    return s
