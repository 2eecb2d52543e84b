// Dev aid (not part of the project): put delayed messages into a real 4.9.8 store with
// messageDelayLevel "1s 3s", let its ScheduleMessageService deliver them, dump inputs and
// the delivered records' raw bytes.
package rmqdelay;

import java.io.BufferedWriter;
import java.io.File;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import com.google.gson.Gson;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.TopicFilterType;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.store.ConsumeQueue;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.SelectMappedBufferResult;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

public class DelayRef {
    static final String[] USER = {"a", "b", "order", "userId", "k01", "k02", "k03", "k04", "k05",
        "k06", "k07", "k08", "k09", "k10", "k11", "k12", "k13", "k14", "k15", "x-y", "_z", "ÄÖÜ", "中文键"};

    static InetSocketAddress addr(String ip, int port) throws Exception {
        return new InetSocketAddress(InetAddress.getByName(ip), port);
    }

    public static void main(String[] a) throws Exception {
        String dir = a[0];
        String out = a[1];
        int n = Integer.parseInt(a[2]);
        MessageStoreConfig c = new MessageStoreConfig();
        c.setStorePathRootDir(dir);
        c.setStorePathCommitLog(dir + File.separator + "commitlog");
        c.setMappedFileSizeCommitLog(4 * 1024 * 1024);
        c.setMappedFileSizeConsumeQueue(1000 * ConsumeQueue.CQ_STORE_UNIT_SIZE);
        c.setBrokerRole(BrokerRole.ASYNC_MASTER);
        c.setMessageIndexEnable(true);
        c.setMessageDelayLevel("1s 3s");
        c.setHaListenPort(0);           // ephemeral: never clash with another store
        DefaultMessageStore s = new DefaultMessageStore(c, new BrokerStatsManager("OracleCluster", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { },
            new BrokerConfig());
        if (!s.load()) throw new IllegalStateException("load failed");
        s.start();
        Random r = new Random(7);
        Gson gson = new Gson();
        List<long[]> expect = new ArrayList<>();
        Map<String, Long> perQueue = new HashMap<>();
        try (BufferedWriter w = Files.newBufferedWriter(Paths.get(out, "delay_inputs.jsonl"), StandardCharsets.UTF_8)) {
            for (int i = 0; i < n; i++) {
                MessageExtBrokerInner m = new MessageExtBrokerInner();
                String topic = (i % 7 == 3) ? "DelayTopicB" : "DelayTopicA";
                int qid = i % 3;
                m.setTopic(topic);
                m.setQueueId(qid);
                byte[] body;
                if (i % 5 == 0) body = new byte[0];
                else if (i % 5 == 1) body = ("délai " + i + " 世界 🚀").getBytes(StandardCharsets.UTF_8);
                else { body = new byte[8 + r.nextInt(400)]; r.nextBytes(body); }
                m.setBody(body);
                m.setFlag(i % 4);
                // insertion order recorded, so the Python side builds the same HashMap
                List<String[]> pairs = new ArrayList<>();
                if (i % 2 == 0) pairs.add(new String[]{"TAGS", "Tag" + (i % 5)});
                if (i % 3 != 1) pairs.add(new String[]{"KEYS", "dk" + i + " dcommon"});
                StringBuilder u = new StringBuilder();
                for (int k = 0; k < 16; k++) u.append(String.format("%02X", r.nextInt(256)));
                pairs.add(new String[]{"UNIQ_KEY", u.toString()});
                int nUser = (i % 6 == 0) ? 22 : (i % 6 == 1 ? 11 : i % 4);
                for (int k = 0; k < nUser; k++) pairs.add(new String[]{USER[(k + i) % USER.length], "v" + i + "_" + k});
                // levels: 1 and 2, and 5 which the store clamps to the highest (2)
                int level = (i % 4 == 3) ? 2 : (i % 9 == 4 ? 5 : 1);
                pairs.add(new String[]{"DELAY", String.valueOf(level)});
                if (i % 8 == 6) pairs.add(new String[]{"WAIT", "true"});
                int sys = 0;
                long prepared = 0;
                if (i % 10 == 7) { sys |= MessageSysFlag.TRANSACTION_COMMIT_TYPE; prepared = 5000 + i; }
                if (i % 11 == 2) sys |= MessageSysFlag.COMPRESSED_FLAG;
                Map<String, String> props = new HashMap<>();
                for (String[] p : pairs) props.put(p[0], p[1]);
                MessageAccessor.setProperties(m, props);
                m.setPropertiesString(MessageDecoder.messageProperties2String(props));
                m.setSysFlag(sys);
                m.setPreparedTransactionOffset(prepared);
                m.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(TopicFilterType.SINGLE_TAG, m.getTags()));
                long born = 1700000000000L + i * 37;
                m.setBornTimestamp(born);
                String bornIp = (i % 6 == 5) ? "2001:db8::" + Integer.toHexString(1 + i) : "10.0." + i + ".9";
                int bornPort = 40000 + i;
                m.setBornHost(addr(bornIp, bornPort));
                if (i % 6 == 5) m.setBornHostV6Flag();
                String storeIp = (i % 9 == 8) ? "::1" : "127.0.0.1";
                m.setStoreHost(addr(storeIp, 10911));
                if (i % 9 == 8) m.setStoreHostAddressV6Flag();
                m.setReconsumeTimes(i % 3);
                PutMessageResult pr = s.putMessage(m);
                if (!pr.isOk()) throw new IllegalStateException("put " + i + ": " + pr);
                JsonObject j = new JsonObject();
                j.addProperty("topic", topic);
                j.addProperty("queueId", qid);
                j.addProperty("flag", i % 4);
                j.addProperty("sysFlag", sys);
                j.addProperty("preparedTransactionOffset", prepared);
                j.addProperty("bornTimestamp", born);
                j.addProperty("bornHost", bornIp);
                j.addProperty("bornPort", bornPort);
                j.addProperty("storeHost", storeIp);
                j.addProperty("storePort", 10911);
                j.addProperty("reconsumeTimes", i % 3);
                j.addProperty("body", Base64.getEncoder().encodeToString(body));
                JsonArray pa = new JsonArray();
                for (String[] p : pairs) { JsonArray e = new JsonArray(); e.add(p[0]); e.add(p[1]); pa.add(e); }
                j.add("properties", pa);
                w.write(gson.toJson(j));
                w.write('\n');
                perQueue.merge(topic + "/" + qid, 1L, Long::sum);
            }
        }
        long deadline = System.currentTimeMillis() + 20000;
        while (System.currentTimeMillis() < deadline) {
            boolean all = true;
            for (Map.Entry<String, Long> e : perQueue.entrySet()) {
                String[] tq = e.getKey().split("/");
                if (s.getMaxOffsetInQueue(tq[0], Integer.parseInt(tq[1])) < e.getValue()) all = false;
            }
            if (all) break;
            Thread.sleep(50);
        }
        Thread.sleep(300);
        // every record in CommitLog order, raw
        long phy = s.getMinPhyOffset();
        long max = s.getMaxPhyOffset();
        int count = 0;
        try (BufferedWriter w = Files.newBufferedWriter(Paths.get(out, "delay_java_commitlog.jsonl"), StandardCharsets.UTF_8)) {
            while (phy < max) {
                SelectMappedBufferResult sb = s.getCommitLogData(phy);
                if (sb == null) break;
                ByteBuffer b = sb.getByteBuffer();
                int size = b.getInt(b.position());
                byte[] rec = new byte[size];
                b.get(rec);
                sb.release();
                JsonObject j = new JsonObject();
                j.addProperty("offset", phy);
                j.addProperty("record", Base64.getEncoder().encodeToString(rec));
                w.write(gson.toJson(j));
                w.write('\n');
                phy += size;
                count++;
            }
        }
        s.shutdown();
        String delayOffset = new String(Files.readAllBytes(Paths.get(dir, "config", "delayOffset.json")), StandardCharsets.UTF_8);
        Files.write(Paths.get(out, "delay_java_delayOffset.json"), delayOffset.getBytes(StandardCharsets.UTF_8));
        System.out.println("{\"records\":" + count + ",\"inputs\":" + n + "}");
        System.exit(0);     // the store leaves non-daemon threads behind
    }
}
