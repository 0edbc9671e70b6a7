// Debezium's embedded engine as a peer of `dblog run` for bench/peers.py.
//
// java -cp <debezium jars> DebeziumPeer.java PROPS EXPECT MODE SECONDS
//
// Runs the connector PROPS describes (a java.util.Properties file) in Debezium's embedded
// engine with the JSON format, and counts the data records of the tables it captures
// (destination ending in one of the table names in the property bench.tables). MODE:
//   count:   until EXPECT records arrived (or the engine stopped, or SECONDS if > 0); prints one JSON line
//            with the time from the first to the last record and the process's CPU time
//            (every JVM thread) over the same span;
//   latency: until a line on standard input (or SECONDS), each record's source commit
//            time (payload.source.ts_ms) against the wall clock when the engine handed it
//            over; prints p50/p99 in ms. With the property bench.time_field, the time is
//            that column of the after row instead (epoch microseconds written by the load
//            just before its commit: MySQL's binlog stamps events in whole seconds);
//   start:   until a line on standard input (or SECONDS), then stops (the connector made
//            its slot: before a load).
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

public class DebeziumPeer {
    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
                .getProcessCpuTime();
    }

    /** The after row's integer column ``field`` (-1: none). */
    static long afterField(String v, String field) {
        int a = v.indexOf("\"after\":{");
        if (a < 0) return -1;
        String key = "\"" + field + "\":";
        int t = v.indexOf(key, a);
        if (t < 0) return -1;
        t += key.length();
        int e = t;
        while (e < v.length() && Character.isDigit(v.charAt(e))) e++;
        return e > t ? Long.parseLong(v.substring(t, e)) : -1;
    }

    static long sourceTs(String v) {
        int s = v.lastIndexOf("\"source\":");
        if (s < 0) return -1;
        int t = v.indexOf("\"ts_ms\":", s);
        if (t < 0) return -1;
        t += 8;
        int e = t;
        while (e < v.length() && Character.isDigit(v.charAt(e))) e++;
        return e > t ? Long.parseLong(v.substring(t, e)) : -1;
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (var r = Files.newBufferedReader(Path.of(args[0]))) { props.load(r); }
        long expect = Long.parseLong(args[1]);
        String mode = args[2];
        double seconds = Double.parseDouble(args[3]);
        String[] tables = props.getProperty("bench.tables", "").split(",");
        props.remove("bench.tables");
        String timeField = props.getProperty("bench.time_field");
        props.remove("bench.time_field");
        AtomicLong count = new AtomicLong();
        AtomicLong firstNs = new AtomicLong(), lastNs = new AtomicLong();
        AtomicLong firstCpu = new AtomicLong(), lastCpu = new AtomicLong();
        List<Long> lat = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(1);
        String[] stopped = {null};
        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
            .using(props)
            .notifying((records, committer) -> {
                for (ChangeEvent<String, String> r : records) {
                    String dest = r.destination();
                    boolean data = false;
                    if (r.value() != null && dest != null)
                        for (String t : tables) if (!t.isEmpty() && dest.endsWith("." + t)) data = true;
                    if (data) {
                        long n = count.incrementAndGet();
                        long now = System.nanoTime();
                        if (n == 1) { firstNs.set(now); firstCpu.set(cpuNanos()); }
                        lastNs.set(now);
                        if (mode.equals("latency")) {  // microseconds
                            java.time.Instant wall = java.time.Instant.now();
                            long nowUs = wall.getEpochSecond() * 1_000_000 + wall.getNano() / 1000;
                            if (timeField != null) {
                                long us = afterField(r.value(), timeField);
                                if (us > 0) lat.add(nowUs - us);
                            } else {
                                long ts = sourceTs(r.value());
                                if (ts > 0) lat.add(nowUs - ts * 1000);
                            }
                        }
                        if (mode.equals("count") && n >= expect) { lastCpu.set(cpuNanos()); done.countDown(); }
                    }
                    committer.markProcessed(r);
                }
                committer.markBatchFinished();
            })
            .using((success, message, error) -> {
                stopped[0] = (success ? "ok: " : "failed: ") + message + (error != null ? " " + error : "");
                done.countDown();
            })
            .build();
        ExecutorService ex = Executors.newSingleThreadExecutor();
        ex.execute(engine);
        if (!mode.equals("count")) {
            Thread stdin = new Thread(() -> {
                try { System.in.read(); } catch (java.io.IOException e) { /* stop */ }
                done.countDown();
            });
            stdin.setDaemon(true);
            stdin.start();
            done.await((long) (seconds * 1000), TimeUnit.MILLISECONDS);
        } else {
            done.await(seconds > 0 ? (long) (seconds * 1000) : 3_600_000L, TimeUnit.MILLISECONDS);
        }
        long n = count.get();
        if (lastCpu.get() == 0) lastCpu.set(cpuNanos());
        StringBuilder out = new StringBuilder("{\"records\":").append(n);
        out.append(",\"seconds\":").append(n > 1 ? (lastNs.get() - firstNs.get()) / 1e9 : 0);
        out.append(",\"cpu_seconds\":").append(n > 1 ? (lastCpu.get() - firstCpu.get()) / 1e9 : 0);
        if (mode.equals("latency")) {
            List<Long> l = new ArrayList<>(lat);
            Collections.sort(l);
            if (!l.isEmpty()) {
                out.append(",\"p50_ms\":").append(l.get(l.size() / 2) / 1000.0);
                out.append(",\"p99_ms\":").append(l.get((int) (l.size() * 0.99)) / 1000.0);
            }
        }
        out.append(",\"stopped\":").append(stopped[0] == null ? "null" : "\"" + stopped[0].replace("\"", "'").replace("\n", " ") + "\"");
        out.append("}");
        System.out.println(out);
        System.out.flush();
        engine.close();
        ex.shutdown();
        ex.awaitTermination(30, TimeUnit.SECONDS);
        System.exit(0);
    }
}
