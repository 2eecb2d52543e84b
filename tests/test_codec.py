# SPDX-License-Identifier: Apache-2.0
"""The shared text formats (rocketstore/codec): broker.conf's java.util.Properties and
fastjson's JSON, and the names config.py and config_manager.py keep re-exporting."""
from rocketstore import config, config_manager
from rocketstore.codec import fastjson, java_properties


def test_a_property_line_written_with_escapes_reads_back_to_the_same_key_and_value():
    cases = {"plain": "value", "a key=with:seps": " leading space", "tab\tkey": "line\nbreak",
             "hash#bang!": "back\\slash", "unicode": "é\U0001F600"}
    text = "\n".join(java_properties.format_property(k, v) for k, v in cases.items())
    assert "\\u00E9\\uD83D\\uDE00" in text                 # non-ASCII as Java writes it
    assert java_properties.parse_properties(text) == cases


def test_properties_bytes_are_read_as_utf8_and_as_latin1_when_they_are_not_utf8():
    assert java_properties.decode_properties_bytes("storePathRootDir=/données".encode()) == \
        "storePathRootDir=/données"
    assert java_properties.decode_properties_bytes(b"k=\xe9") == "k=\u00e9"


def test_fastjson_writes_beans_sorted_and_reads_its_unquoted_integer_keys_back():
    value = fastjson.bean(offsetTable={"t@g": {1: 5, 0: 3}}, absent=None, dataVersion=1)
    text = fastjson.to_fastjson(value)
    assert text == '{\n\t"dataVersion":1,\n\t"offsetTable":{\n\t\t"t@g":{0:3,1:5\n\t\t}\n\t}\n}'
    assert fastjson.parse_fastjson(text) == {"dataVersion": 1,
                                             "offsetTable": {"t@g": {"0": 3, "1": 5}}}


def test_the_old_import_paths_still_name_the_codec_functions():
    assert config.parse_properties is java_properties.parse_properties
    assert config_manager.parse_fastjson is fastjson.parse_fastjson
    assert config_manager.to_fastjson is fastjson.to_fastjson
    assert config_manager.bean is fastjson.bean
