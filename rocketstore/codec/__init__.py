# SPDX-License-Identifier: Apache-2.0
"""Text formats the store shares with a Java broker: `java_properties` (broker.conf) and
`fastjson` (the JSON files under config/)."""
