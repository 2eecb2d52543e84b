// SPDX-License-Identifier: Apache-2.0
// Read throughput of Apache RocketMQ 4.9.8's own DefaultMessageStore.getMessage, to compare with
// bench/bench_read.py's get_message in the same run. A development tool: nothing in the project,
// its tests or CI builds or runs it; doc/performance.md "Reading a queue" has the commands (it
// compiles against the store classes built from the 4.9.8 source tag, outside this repository).
//
//   java ... GetBench STORE_DIR --commitlog-size B --cq-size B [--pull P] [--seconds S]
//
// STORE_DIR is a store rocketstore wrote (the formats are the same): one queue of BenchTopic0
// holding N + 1024 messages, as bench_read.py builds it. The Java store loads it and, on one
// thread, for each backlog (1024, and the queue's max - 1024), times rounds that pull the 1024
// messages at queue offset max - backlog, P per getMessage (default 32), as bench_read.py does.
// Two variants: the broker's view (getMessage, then release the mapped buffers: no decode) and
// decoded (MessageDecoder.decode of every buffer, body included, as get_message returns
// MessageExt). The first S seconds (default 5) warm the JIT and are not reported; then each
// variant runs S seconds. Checks: every pull answers FOUND with P messages, and the last one's
// queue offsets are the ones asked for. One JSON line per variant and backlog on stdout. The
// store directory is left as it was found, apart from the checkpoint and config files a load and
// shutdown write.
import java.io.File;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.util.List;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.GetMessageStatus;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

public class GetBench {
    static final String TOPIC = "BenchTopic0";
    static final int WINDOW = 1024;
    static long sink;

    public static void main(String[] a) {
        // A failure exits: the store's non-daemon threads would otherwise keep the JVM alive.
        try {
            bench(a);
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
    }

    static void bench(String[] a) throws Exception {
        String dir = a[0];
        int clSize = 0, cqSize = 0, pull = 32;
        double seconds = 5;
        for (int i = 1; i < a.length; i++) {
            switch (a[i]) {
                case "--commitlog-size": clSize = Integer.parseInt(a[++i]); break;
                case "--cq-size": cqSize = Integer.parseInt(a[++i]); break;
                case "--pull": pull = Integer.parseInt(a[++i]); break;
                case "--seconds": seconds = Double.parseDouble(a[++i]); break;
                default: throw new IllegalArgumentException(a[i]);
            }
        }
        MessageStoreConfig c = new MessageStoreConfig();
        c.setStorePathRootDir(dir);
        c.setStorePathCommitLog(dir + File.separator + "commitlog");
        c.setMappedFileSizeCommitLog(clSize);
        c.setMappedFileSizeConsumeQueue(cqSize);
        c.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        c.setBrokerRole(BrokerRole.ASYNC_MASTER);
        // The HA listener on an ephemeral port: another store on this machine may hold 10912.
        c.setHaListenPort(0);
        // An in-process read, not a network pull: let one call return `pull` messages.
        c.setMaxTransferCountOnMessageInMemory(Math.max(pull, 32));
        c.setMaxTransferBytesOnMessageInMemory(Math.max(pull, 32) * 1024);
        DefaultMessageStore s = new DefaultMessageStore(c, new BrokerStatsManager("BenchCluster", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { },
            new BrokerConfig());
        if (!s.load()) throw new IllegalStateException("load failed");
        s.start();
        long max = s.getMaxOffsetInQueue(TOPIC, 0);
        if (max < 2 * WINDOW) throw new IllegalStateException("queue holds " + max + " messages");

        long[] backlogs = {WINDOW, max - WINDOW};
        run(s, max, backlogs[1], pull, false, seconds);          // JIT warm-up, not reported
        run(s, max, backlogs[0], pull, true, seconds);
        for (boolean decode : new boolean[] {false, true}) {
            for (long backlog : backlogs) {
                double[] r = run(s, max, backlog, pull, decode, seconds);
                System.out.printf("{\"variant\":\"%s\",\"pull\":%d,\"backlog\":%d,\"meanMsgsPerSec\":%.0f,"
                        + "\"bestMsgsPerSec\":%.0f,\"rounds\":%.0f,\"threadCpuNsPerMsg\":%.1f}%n",
                    decode ? "getMessage+decode" : "getMessage", pull, backlog, r[0], r[1], r[2], r[3]);
            }
        }
        s.shutdown();
        System.out.println("{\"sink\":" + (sink & 1) + "}");
        System.exit(0);   // the store leaves non-daemon threads behind
    }

    /** {mean msgs/s, fastest round's msgs/s, rounds, the thread's CPU ns per message} of rounds
     *  over one window. The CPU time is the reading thread's own, over the timed rounds only: a
     *  per-thread cost that other processes on a loaded machine do not inflate as they do wall
     *  time. */
    static double[] run(DefaultMessageStore s, long max, long backlog, int pull, boolean decode,
                        double seconds) {
        long start = max - backlog;
        long rounds = 0, nanos = 0, best = Long.MAX_VALUE, cpu = 0;
        ThreadMXBean tmx = ManagementFactory.getThreadMXBean();
        long until = System.nanoTime() + (long) (seconds * 1e9);
        while (System.nanoTime() < until) {
            long c0 = tmx.getCurrentThreadCpuTime();
            long t0 = System.nanoTime();
            GetMessageResult g = null;
            for (long off = start; off < start + WINDOW; off += pull) {
                g = s.getMessage("bench", TOPIC, 0, off, pull, null);
                if (g.getStatus() != GetMessageStatus.FOUND || g.getMessageCount() != pull)
                    throw new IllegalStateException("offset " + off + ": " + g.getStatus() + ", "
                        + g.getMessageCount() + " messages");
                if (decode) {
                    for (ByteBuffer b : g.getMessageBufferList()) {
                        MessageExt m = MessageDecoder.decode(b.duplicate(), true, false);
                        sink += m.getBody().length + m.getQueueOffset();
                    }
                }
                if (off + pull < start + WINDOW) g.release();
            }
            long dt = System.nanoTime() - t0;
            cpu += tmx.getCurrentThreadCpuTime() - c0;
            // outside the timed round: the last pull holds the offsets asked for
            List<ByteBuffer> last = g.getMessageBufferList();
            long want = start + WINDOW - pull;
            for (ByteBuffer b : last) {
                long q = MessageDecoder.decode(b.duplicate(), true, false).getQueueOffset();
                if (q != want++) throw new IllegalStateException("queue offset " + q);
            }
            g.release();
            rounds++;
            nanos += dt;
            best = Math.min(best, dt);
        }
        return new double[] {WINDOW * rounds / (nanos / 1e9), WINDOW / (best / 1e9), rounds,
            (double) cpu / (WINDOW * rounds)};
    }
}
