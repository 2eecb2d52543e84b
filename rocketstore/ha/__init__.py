# SPDX-License-Identifier: Apache-2.0
"""Classic master/slave replication (doc/05): wire codecs, master, slave, SYNC_MASTER waits."""
