# SPDX-License-Identifier: Apache-2.0
"""StoreConfig: 4.9.x defaults, broker.conf parsing, validation and derived values."""
import dataclasses
import os
import re

import pytest

from rocketstore.config import (
    JAVA_KEYS,
    BrokerRole,
    FlushDiskType,
    StoreConfig,
    camel_to_snake,
    parse_delay_level,
    parse_properties,
)
from rocketstore import config
from rocketstore.errors import ConfigError

# The "Default configuration values" table of doc/README, by Java key.
SPEC_DEFAULTS = {
    "mappedFileSizeCommitLog": 1_073_741_824,
    "mappedFileSizeConsumeQueue": 6_000_000,
    "enableConsumeQueueExt": False,
    "mappedFileSizeConsumeQueueExt": 48 * 1024 * 1024,
    "bitMapLengthConsumeQueueExt": 64,
    "maxMessageSize": 4_194_304,
    "useReentrantLockWhenPutMessage": True,
    "osPageCacheBusyTimeOutMills": 1000,
    "checkCRCOnRecover": True,
    "messageDelayLevel": "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
    "flushDiskType": FlushDiskType.ASYNC_FLUSH,
    "syncFlushTimeout": 5000,
    "flushIntervalCommitLog": 500,
    "flushCommitLogLeastPages": 4,
    "flushCommitLogThoroughInterval": 10_000,
    "flushCommitLogTimed": True,
    "transientStorePoolEnable": False,
    "transientStorePoolSize": 5,
    "fastFailIfNoBufferInStorePool": False,
    "commitIntervalCommitLog": 200,
    "commitCommitLogLeastPages": 4,
    "commitCommitLogThoroughInterval": 200,
    "flushIntervalConsumeQueue": 1000,
    "flushConsumeQueueLeastPages": 2,
    "flushConsumeQueueThoroughInterval": 60_000,
    "warmMapedFileEnable": False,
    "flushLeastPagesWhenWarmMapedFile": 4096,
    "messageIndexEnable": True,
    "messageIndexSafe": False,
    "maxHashSlotNum": 5_000_000,
    "maxIndexNum": 20_000_000,
    "maxMsgsNumBatch": 64,
    "defaultQueryMaxNum": 32,
    "maxTransferBytesOnMessageInMemory": 262_144,
    "maxTransferCountOnMessageInMemory": 32,
    "maxTransferBytesOnMessageInDisk": 65_536,
    "maxTransferCountOnMessageInDisk": 8,
    "accessMessageInMemoryMaxRatio": 40,
    "offsetCheckInSlave": False,
    "duplicationEnable": False,
    "cleanResourceInterval": 10_000,
    "fileReservedTime": 72,
    "deleteWhen": "04",
    "diskMaxUsedSpaceRatio": 75,
    "diskSpaceWarningLevelRatio": 0.90,
    "diskSpaceCleanForciblyRatio": 0.85,
    "cleanFileForciblyEnable": True,
    "deleteCommitLogFilesInterval": 100,
    "deleteConsumeQueueFilesInterval": 100,
    "destroyMapedFileIntervalForcibly": 120_000,
    "redeleteHangedFileInterval": 120_000,
    "deleteFileBatchMax": 10,
    "brokerRole": BrokerRole.ASYNC_MASTER,
    "haListenPort": 10912,
    "haSendHeartbeatInterval": 5000,
    "haHousekeepingInterval": 20_000,
    "haSlaveFallbehindMax": 268_435_456,
    "slaveTimeout": 3000,
    "putMsgIndexHightWater": 600_000,
    "flushDelayOffsetInterval": 10_000,
}

BROKER_CONF = r"""# A broker.conf as operators write it
brokerClusterName = DefaultCluster
brokerName = broker-a
brokerId = 0
! bang comments too
deleteWhen = 04;16
fileReservedTime = 48
brokerRole = SYNC_MASTER
flushDiskType: SYNC_FLUSH
brokerIP1 = 10.0.0.7
listenPort 20911
namesrvAddr=10.0.0.1:9876;\
            10.0.0.2:9876
storePathRootDir=/data/rocketmq/store
storePathCommitLog=/data/rocketmq/commitlog
mappedFileSizeCommitLog=104857600
mappedFileSizeConsumeQueue = 300010
messageDelayLevel=1s 5s \
    10s 2h
maxMessageSize=65536   
checkCRCOnRecover=false
transientStorePoolEnable=true
autoCreateTopicEnable=false
"""


def test_defaults_match_spec_table():
    cfg = StoreConfig()
    for key, expected in SPEC_DEFAULTS.items():
        assert getattr(cfg, camel_to_snake(key)) == expected, key
    assert cfg.store_path_root_dir == os.path.join(os.path.expanduser("~"), "store")
    assert cfg.store_path_commit_log is None
    assert cfg.commitlog_dir() == os.path.join(cfg.store_path_root_dir, "commitlog")
    assert cfg.store_host == ("127.0.0.1", 10911)
    assert cfg.ha_master_address is None
    assert cfg.ha_bind_address == "127.0.0.1"
    assert cfg.prefault_next_file is True
    # Not 4.9.x's 32 KiB: the largest frame a 4.9 slave's 4 MiB read buffer takes (doc/05).
    assert cfg.ha_transfer_batch_size == 4 * 1024 * 1024 - 12
    assert cfg.extra_properties == {}
    assert "extra_properties" not in repr(cfg)


def test_every_java_key_maps_back_to_its_field():
    names = {f.name for f in dataclasses.fields(StoreConfig)}
    assert set(JAVA_KEYS) == names - {"store_host", "extra_properties"}
    for name, key in JAVA_KEYS.items():
        assert camel_to_snake(key) == name, key
    assert JAVA_KEYS["check_crc_on_recover"] == "checkCRCOnRecover"
    assert JAVA_KEYS["d_leger_group"] == "dLegerGroup"
    assert JAVA_KEYS["store_path_d_ledger_commit_log"] == "storePathDLedgerCommitLog"
    assert JAVA_KEYS["schedule_async_deliver_max_resend_num2_blocked"] == \
        "scheduleAsyncDeliverMaxResendNum2Blocked"


def test_from_properties_reads_a_broker_conf(tmp_path):
    path = tmp_path / "broker.conf"
    path.write_text(BROKER_CONF)
    cfg = StoreConfig.from_properties(path)
    assert cfg.delete_when == "04;16"
    assert cfg.file_reserved_time == 48
    assert cfg.broker_role is BrokerRole.SYNC_MASTER
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert cfg.store_host == ("10.0.0.7", 20911)
    assert cfg.ha_listen_port == 20912                   # listenPort + 1, as BrokerStartup does
    assert cfg.store_path_root_dir == "/data/rocketmq/store"
    assert cfg.commitlog_dir() == "/data/rocketmq/commitlog"
    assert cfg.mapped_file_size_commit_log == 104_857_600
    assert cfg.mapped_file_size_consume_queue == 300_010
    assert cfg.message_delay_level == "1s 5s 10s 2h"
    assert cfg.max_message_size == 65_536                # trailing blanks trimmed
    assert cfg.check_crc_on_recover is False
    assert cfg.transient_store_pool_enable is True
    assert cfg.effective_transient_store_pool_enable is False  # SYNC_FLUSH turns it off
    assert cfg.extra_properties == {
        "brokerClusterName": "DefaultCluster",
        "brokerName": "broker-a",
        "brokerId": "0",
        "namesrvAddr": "10.0.0.1:9876;10.0.0.2:9876",
        "autoCreateTopicEnable": "false",
    }
    # The same file as a str path and as text.
    assert StoreConfig.from_properties(str(path)) == cfg
    assert StoreConfig.from_properties(BROKER_CONF) == cfg


def test_from_properties_explicit_ha_port_and_overrides():
    cfg = StoreConfig.from_properties({"listenPort": "30911", "haListenPort": "40000"},
                                      max_index_num=1000, broker_role="SLAVE")
    assert cfg.store_host == ("127.0.0.1", 30911)
    assert cfg.ha_listen_port == 40000
    assert cfg.max_index_num == 1000
    assert cfg.broker_role is BrokerRole.SLAVE
    with pytest.raises(TypeError):
        StoreConfig.from_properties({}, no_such_field=1)


def test_from_properties_accepts_aliases_and_percent_ratios():
    cfg = StoreConfig.from_properties({
        "isEnableBatchPush": "false",          # Java field name, as object2Properties writes it
        "haMaxGapNotInSync": "1024",           # 5.x name of haSlaveFallbehindMax
        "diskSpaceWarningLevelRatio": "80",    # 5.x writes percent
        "diskSpaceCleanForciblyRatio": "0.7",  # 4.9.x system property style
    })
    assert cfg.enable_batch_push is False and "isEnableBatchPush" not in cfg.extra_properties
    assert cfg.ha_slave_fallbehind_max == 1024
    assert cfg.disk_space_warning_level_ratio == pytest.approx(0.80)
    assert cfg.disk_space_clean_forcibly_ratio == pytest.approx(0.70)


def test_properties_syntax():
    text = (
        "  a=1\n"
        "b : 2\n"
        "c\t3\n"
        "d\n"
        "e = \\  lead\n"
        "key\\ with\\:seps = v\\=x\n"
        "uni=\\u00e9\\u4e2d\\ud83d\\ude00\n"
        "esc=t\\tn\\nq\\q\n"
        "cont=one\\\n"
        "   #two\n"
        "# comment \\\n"
        "f=after-comment\n"
        "even=x\\\\\n"
        "g=last\r\n"
        "h=cr\rlast=end\\"
    )
    props = parse_properties(text)
    assert props == {
        "a": "1", "b": "2", "c": "3", "d": "", "e": "  lead",
        "key with:seps": "v=x", "uni": "é中\U0001F600", "esc": "t\tn\nqq",
        "cont": "one#two", "f": "after-comment", "even": "x\\", "g": "last", "h": "cr",
        "last": "end",
    }
    with pytest.raises(ConfigError, match="uxxxx"):
        parse_properties("bad=\\u12G4")


@pytest.mark.parametrize("key, value", [
    ("mappedFileSizeCommitLog", "1G"),
    ("mappedFileSizeCommitLog", "0"),
    ("mappedFileSizeConsumeQueue", "-20"),
    ("maxMessageSize", "3000000000"),          # past Java int
    ("flushDiskType", "FAST_FLUSH"),
    ("brokerRole", "MASTER"),
    ("checkCRCOnRecover", "yes"),
    ("haListenPort", "70000"),
    ("haTransferBatchSize", "4194293"),        # a 4.9 slave's read buffer never holds it
    ("haTransferBatchSize", "0"),
    ("deleteWhen", "4am"),
    ("messageDelayLevel", "1s 5x"),
    ("messageDelayLevel", "1s  5s"),           # Java splits on single spaces
    ("diskSpaceWarningLevelRatio", "lots"),
    ("listenPort", "http"),
    ("brokerIP1", "broker.example.com"),
])
def test_bad_values_raise_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        StoreConfig.from_properties({key: value})


@pytest.mark.parametrize("kwargs, field_name", [
    ({"mapped_file_size_commit_log": "1024"}, "mapped_file_size_commit_log"),
    ({"mapped_file_size_commit_log": 0}, "mapped_file_size_commit_log"),
    ({"message_index_enable": 1}, "message_index_enable"),
    ({"max_hash_slot_num": True}, "max_hash_slot_num"),
    ({"flush_disk_type": 3}, "flush_disk_type"),
    ({"store_host": ("localhost", 10911)}, "store_host"),
    ({"store_host": ("127.0.0.1", 65536)}, "store_host"),
    ({"store_host": ("127.0.0.1",)}, "store_host"),
    ({"ha_bind_address": "any"}, "ha_bind_address"),
    ({"disk_space_clean_forcibly_ratio": 1.5}, "disk_space_clean_forcibly_ratio"),
    ({"store_path_root_dir": None}, "store_path_root_dir"),
    ({"os_page_cache_busy_time_out_mills": 1 << 63}, "os_page_cache_busy_time_out_mills"),
])
def test_constructor_validates(kwargs, field_name):
    with pytest.raises(ConfigError, match=field_name):
        StoreConfig(**kwargs)


def test_constructor_normalises():
    cfg = StoreConfig(flush_disk_type="SYNC_FLUSH", broker_role="slave",
                      store_host=["::1", 9876], disk_space_warning_level_ratio=1,
                      flush_delay_offset_interval=1 << 40)
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert cfg.broker_role is BrokerRole.SLAVE
    assert cfg.store_host == ("::1", 9876)
    assert isinstance(cfg.disk_space_warning_level_ratio, float)
    with pytest.raises(TypeError):
        StoreConfig(not_a_field=1)


@pytest.mark.parametrize("configured, rounded", [
    (6_000_000, 6_000_000), (1, 20), (19, 20), (20, 20), (21, 40), (300_010, 300_020),
])
def test_cq_file_size_rounds_up_to_whole_units(configured, rounded):
    cfg = StoreConfig(mapped_file_size_consume_queue=configured)
    assert cfg.cq_file_size == rounded
    assert cfg.mapped_file_size_consume_queue == configured


def test_delay_levels():
    cfg = StoreConfig()
    levels = cfg.delay_levels
    assert cfg.max_delay_level == 18
    assert levels[0] == 1000                  # level 1
    assert levels[4] == 60_000                # level 5 = 1m
    assert levels[17] == 7_200_000            # level 18 = 2h
    assert parse_delay_level("2d 3h ") == [2 * 86_400_000, 3 * 3_600_000]
    with pytest.raises(ValueError):
        parse_delay_level("1S")               # units are lower case in Java's table


@pytest.mark.parametrize("configured, effective", [
    (75, 75), (5, 10), (10, 10), (-1, 10), (95, 95), (99, 95),
])
def test_disk_max_used_space_ratio_clamps(configured, effective):
    cfg = StoreConfig(disk_max_used_space_ratio=configured)
    assert cfg.effective_disk_max_used_space_ratio == effective
    assert cfg.disk_max_used_space_ratio == configured


def test_transient_store_pool_needs_async_flush_master():
    assert StoreConfig(transient_store_pool_enable=True).effective_transient_store_pool_enable
    assert not StoreConfig(transient_store_pool_enable=True,
                           broker_role=BrokerRole.SLAVE).effective_transient_store_pool_enable
    assert not StoreConfig().effective_transient_store_pool_enable


def test_commitlog_dir_root_argument():
    assert StoreConfig().commitlog_dir("/x") == os.path.join("/x", "commitlog")
    assert StoreConfig(store_path_commit_log="/y").commitlog_dir("/x") == "/y"


def test_round_trip_through_to_properties(tmp_path):
    path = tmp_path / "broker.conf"
    path.write_text(BROKER_CONF)
    original = StoreConfig.from_properties(
        path,
        store_host=("fe80::1", 10911),
        ha_master_address="10.0.0.9:10912",
        store_path_commit_log="C:\\rocketmq\\commit log",
        message_delay_level="1s 2m 3d",
        delete_when="04",
    )
    original.extra_properties["note"] = "#not a comment = é"
    text = original.to_properties()
    assert "checkCRCOnRecover=false" in text
    assert "brokerIP1=fe80\\:\\:1" in text
    assert "storePathCommitLog=C\\:\\\\rocketmq\\\\commit log" in text
    assert "storePathDLedgerCommitLog" not in text          # None is left out
    again = StoreConfig.from_properties(text)
    assert again == original
    path2 = tmp_path / "again.conf"
    path2.write_text(text, encoding="latin-1")              # ASCII only after escaping
    assert StoreConfig.from_properties(path2) == original
    assert StoreConfig.from_properties(StoreConfig().to_properties()) == StoreConfig()


# ---- honest config: a field is implemented, or refused when set --------------------------
def _other_value(name):
    default = getattr(StoreConfig(), name)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    return "x"


@pytest.mark.parametrize("name", sorted(config.NOT_IMPLEMENTED))
def test_a_field_rocketstore_does_not_implement_is_refused_when_set(name):
    StoreConfig(**{name: getattr(StoreConfig(), name)})          # its default is fine
    with pytest.raises(ConfigError, match=f"{name}.*not implemented by rocketstore"):
        StoreConfig(**{name: _other_value(name)})
    key = config.JAVA_KEYS[name]
    with pytest.raises(ConfigError, match="not implemented"):
        StoreConfig.from_properties({key: str(_other_value(name)).lower()})


def _package_source():
    # The package under test, installed or in the tree (its .py files, not the .pyi stubs).
    import rocketstore
    root = os.path.dirname(os.path.abspath(rocketstore.__file__))
    text = []
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".py") and not (d == root and n == "config.py"):
                with open(os.path.join(d, n)) as f:
                    text.append(f.read())
    pyx = os.path.join(os.path.dirname(root), "pyx")
    for n in os.listdir(pyx) if os.path.isdir(pyx) else ():
        if n.endswith((".pyx", ".pxi")):
            with open(os.path.join(pyx, n)) as f:
                text.append(f.read())
    return "\n".join(text)


# Fields the store reads through one of StoreConfig's derived getters.
_READ_VIA = {"disk_max_used_space_ratio": "effective_disk_max_used_space_ratio",
             "message_delay_level": "delay_levels",
             "store_path_commit_log": "commitlog_dir",
             "transient_store_pool_enable": "effective_transient_store_pool_enable"}


def test_every_field_is_either_read_by_the_store_or_listed_as_not_implemented():
    source = _package_source()
    fields = {f.name for f in dataclasses.fields(StoreConfig)} - {"extra_properties"}
    read = {name for name in fields
            if re.search(rf"\b{_READ_VIA.get(name, name)}\b", source)}
    assert read & set(config.NOT_IMPLEMENTED) == set(), "implemented now: drop from the table"
    assert fields - read - set(config.NOT_IMPLEMENTED) == set(), "read nowhere: implement it"


def test_from_properties_warns_about_a_key_no_broker_knows(caplog):
    with caplog.at_level("WARNING", logger="rocketstore.config"):
        cfg = StoreConfig.from_properties({"brokerName": "b", "namesrvAddr": "n:9876",
                                           "flushDiskTyp": "SYNC_FLUSH"})
    assert cfg.extra_properties == {"brokerName": "b", "namesrvAddr": "n:9876",
                                    "flushDiskTyp": "SYNC_FLUSH"}
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "'flushDiskTyp'" in warned[0]
