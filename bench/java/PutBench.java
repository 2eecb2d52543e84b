// SPDX-License-Identifier: Apache-2.0
// Put throughput of Apache RocketMQ 4.9.8's own DefaultMessageStore, to compare with
// bench/bench_put.py in the same run. A development tool: nothing in the project, its tests or CI
// builds or runs it; README "Measuring the Java store beside ours" has the commands (it compiles
// against the store classes built from the 4.9.8 source tag, outside this repository).
//
//   java ... PutBench STORE_DIR single|batch [--messages N] [--warmup W] [--chunk C] [--body B]
//
// One thread, ASYNC_FLUSH, ASYNC_MASTER, 1 GiB CommitLog files, index on (the defaults). The
// messages have the shape of rocketstore.workload.make_messages: topic BenchTopic0, queue i % 4,
// tags "Tag<i % 8>", keys "key-<i>", a 128-byte body, born host 10.0.0.7:40001. Messages are
// built CHUNK at a time outside the timed region, as far as the broker would have prepared them
// before calling the store (properties string and tags code set, as SendMessageProcessor does),
// so only DefaultMessageStore.putMessage / putMessages is timed. `batch` puts MessageExtBatch
// bodies of 1000 messages (MessageDecoder.encodeMessages, as a client's batch send), all to one
// queue (batch number % 4), since a RocketMQ batch has one queue. WARMUP messages go first
// (JIT, first CommitLog file) and are not timed. Checks: every put answered PUT_OK, and once
// reput caught up the queues hold every message and a sample of bodies reads back. The store
// directory is deleted at the end. One JSON line on stdout.
import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.TopicFilterType;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExtBatch;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.GetMessageStatus;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

public class PutBench {
    static final String TOPIC = "BenchTopic0";
    static final int QUEUES = 4;
    static final int BATCH = 1000;

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
        boolean batch = a[1].equals("batch");
        int n = 2_000_000, warmup = 200_000, chunk = 100_000, bodySize = 128;
        for (int i = 2; i < a.length; i++) {
            switch (a[i]) {
                case "--messages": n = Integer.parseInt(a[++i]); break;
                case "--warmup": warmup = Integer.parseInt(a[++i]); break;
                case "--chunk": chunk = Integer.parseInt(a[++i]); break;
                case "--body": bodySize = Integer.parseInt(a[++i]); break;
                default: throw new IllegalArgumentException(a[i]);
            }
        }
        if (batch && (n % BATCH != 0 || warmup % BATCH != 0 || chunk % BATCH != 0))
            throw new IllegalArgumentException("batch: counts must be multiples of " + BATCH);

        MessageStoreConfig c = new MessageStoreConfig();
        c.setStorePathRootDir(dir);
        c.setStorePathCommitLog(dir + File.separator + "commitlog");
        c.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        c.setBrokerRole(BrokerRole.ASYNC_MASTER);
        // The HA listener on an ephemeral port: another store on this machine may hold 10912.
        c.setHaListenPort(0);
        DefaultMessageStore s = new DefaultMessageStore(c, new BrokerStatsManager("BenchCluster", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { },
            new BrokerConfig());
        if (!s.load()) throw new IllegalStateException("load failed");
        s.start();

        // the body pool of make_messages' shape: printable bytes, a 128-byte window per message
        Random rng = new Random(7);
        byte[] pool = new byte[4096 + bodySize];
        for (int i = 0; i < pool.length; i++) pool[i] = (byte) (48 + rng.nextInt(75));
        InetSocketAddress born = new InetSocketAddress(InetAddress.getByName("10.0.0.7"), 40001);
        InetSocketAddress store = new InetSocketAddress(InetAddress.getByName("127.0.0.1"), 10911);

        long notOk = 0, putNanos = 0, timed = 0, putCpu = 0;
        // The putting thread's own CPU time over the timed chunks: a per-thread cost that other
        // processes on a loaded machine do not inflate the way they inflate wall time.
        ThreadMXBean tmx = ManagementFactory.getThreadMXBean();
        double bestChunk = 0;
        int next = 0;
        while (next < warmup + n) {
            int count = Math.min(chunk, warmup + n - next);
            if (next < warmup) count = Math.min(count, warmup - next);
            boolean timedChunk = next >= warmup;
            long t0, t1, c0, c1;
            if (!batch) {
                MessageExtBrokerInner[] msgs = new MessageExtBrokerInner[count];
                for (int k = 0; k < count; k++) msgs[k] = single(next + k, pool, bodySize, born, store);
                c0 = tmx.getCurrentThreadCpuTime();
                t0 = System.nanoTime();
                for (MessageExtBrokerInner m : msgs) {
                    PutMessageResult r = s.putMessage(m);
                    if (!r.isOk()) notOk++;
                }
                t1 = System.nanoTime();
            } else {
                MessageExtBatch[] bs = new MessageExtBatch[count / BATCH];
                for (int k = 0; k < bs.length; k++) bs[k] = batch(next + k * BATCH, pool, bodySize, born, store);
                c0 = tmx.getCurrentThreadCpuTime();
                t0 = System.nanoTime();
                for (MessageExtBatch b : bs) {
                    PutMessageResult r = s.putMessages(b);
                    if (!r.isOk()) notOk++;
                }
                t1 = System.nanoTime();
            }
            c1 = tmx.getCurrentThreadCpuTime();
            if (timedChunk) {
                putCpu += c1 - c0;
                putNanos += t1 - t0;
                timed += count;
                bestChunk = Math.max(bestChunk, count / ((t1 - t0) / 1e9));
            }
            next += count;
        }

        // outside the timed region: reput caught up, every message is in its queue, bodies read back
        long deadline = System.currentTimeMillis() + 300_000;
        while (s.dispatchBehindBytes() > 0 && System.currentTimeMillis() < deadline) Thread.sleep(10);
        long inQueues = 0;
        for (int q = 0; q < QUEUES; q++) inQueues += s.getMaxOffsetInQueue(TOPIC, q);
        int checked = 0;
        Random pick = new Random(1);
        for (int k = 0; k < 100; k++) {
            int i = pick.nextInt(warmup + n);
            // single: round-robin over the queues; batch: batch b went whole to queue b % 4
            int q = batch ? (i / BATCH) % QUEUES : i % QUEUES;
            long qOffset = batch ? (long) (i / BATCH / QUEUES) * BATCH + i % BATCH : i / QUEUES;
            GetMessageResult g = s.getMessage("bench", TOPIC, q, qOffset, 1, null);
            if (g.getStatus() != GetMessageStatus.FOUND) throw new IllegalStateException("message " + i + " missing");
            ByteBuffer rec = g.getMessageBufferList().get(0);
            byte[] body = MessageDecoder.decode(rec, true, false).getBody();
            g.release();
            int off = (i * 131) % 4096;
            if (!Arrays.equals(body, Arrays.copyOfRange(pool, off, off + bodySize)))
                throw new IllegalStateException("message " + i + ": body differs");
            checked++;
        }
        s.shutdown();
        deleteTree(new File(dir).toPath());
        if (notOk != 0 || inQueues != (long) warmup + n)
            throw new IllegalStateException(notOk + " puts not OK; " + inQueues + " of " + (warmup + n) + " in the queues");
        System.out.printf("{\"mode\":\"%s\",\"messages\":%d,\"warmup\":%d,\"body\":%d,\"putSeconds\":%.4f,"
                + "\"putMsgsPerSec\":%.0f,\"bestChunkMsgsPerSec\":%.0f,\"chunk\":%d,\"bodiesChecked\":%d,"
                + "\"putThreadCpuNsPerMsg\":%.0f}%n",
            batch ? "putMessages(batch of 1000)" : "putMessage", timed, warmup, bodySize, putNanos / 1e9,
            timed / (putNanos / 1e9), bestChunk, chunk, checked, (double) putCpu / timed);
        System.exit(0);   // the store leaves non-daemon threads behind
    }

    static MessageExtBrokerInner single(int i, byte[] pool, int bodySize, InetSocketAddress born,
                                        InetSocketAddress store) {
        MessageExtBrokerInner m = new MessageExtBrokerInner();
        m.setTopic(TOPIC);
        m.setQueueId(i % QUEUES);
        int off = (i * 131) % 4096;
        m.setBody(Arrays.copyOfRange(pool, off, off + bodySize));
        Map<String, String> props = new HashMap<>();
        props.put(MessageConst.PROPERTY_TAGS, "Tag" + (i % 8));
        props.put(MessageConst.PROPERTY_KEYS, "key-" + i);
        MessageAccessor.setProperties(m, props);
        m.setPropertiesString(MessageDecoder.messageProperties2String(props));
        m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(TopicFilterType.SINGLE_TAG, m.getTags()));
        m.setBornTimestamp(1_700_000_000_000L + i);
        m.setBornHost(born);
        m.setStoreHost(store);
        return m;
    }

    static MessageExtBatch batch(int first, byte[] pool, int bodySize, InetSocketAddress born,
                                 InetSocketAddress store) {
        List<Message> list = new ArrayList<>(BATCH);
        for (int i = first; i < first + BATCH; i++) {
            int off = (i * 131) % 4096;
            list.add(new Message(TOPIC, "Tag" + (i % 8), "key-" + i, Arrays.copyOfRange(pool, off, off + bodySize)));
        }
        MessageExtBatch b = new MessageExtBatch();
        b.setTopic(TOPIC);
        b.setQueueId((first / BATCH) % QUEUES);
        b.setBody(MessageDecoder.encodeMessages(list));
        b.setBornTimestamp(1_700_000_000_000L + first);
        b.setBornHost(born);
        b.setStoreHost(store);
        return b;
    }

    static void deleteTree(Path root) throws IOException {
        if (!Files.exists(root)) return;
        Files.walkFileTree(root, new SimpleFileVisitor<Path>() {
            @Override public FileVisitResult visitFile(Path f, BasicFileAttributes at) throws IOException {
                Files.delete(f);
                return FileVisitResult.CONTINUE;
            }
            @Override public FileVisitResult postVisitDirectory(Path d, IOException e) throws IOException {
                Files.delete(d);
                return FileVisitResult.CONTINUE;
            }
        });
    }
}
