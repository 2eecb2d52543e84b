# SPDX-License-Identifier: Apache-2.0
"""Classic master/slave replication (spec 05): wire codecs, master, slave, SYNC_MASTER waits."""
