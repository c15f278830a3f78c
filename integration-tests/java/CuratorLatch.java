import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryOneTime;

/**
 * One Apache Curator LeaderLatch participant, for the election interop
 * tests in integration-tests/tests/zookeeper.rs.
 *
 * <p>Usage: {@code CuratorLatch CONNECT_STRING LATCH_PATH PARTICIPANT_ID}.
 * Starts a LeaderLatch on the path with the participant id and prints, one
 * line each:
 * <ul>
 * <li>{@code JOINED <node name>} once its latch node exists (always before
 * its first {@code LEADER});</li>
 * <li>{@code LEADER <epoch millis>} when it gains leadership, {@code
 * NOT_LEADER} when it loses it.</li>
 * </ul>
 * Commands on stdin, one a line: {@code has} answers {@code HAS true} or
 * {@code HAS false} (hasLeadership); {@code leader} answers {@code
 * LEADER_ID <id>} with the id Curator's getLeader() reads, or {@code
 * NO_LEADER}; {@code close} (or end of input) closes the latch, which
 * deletes its node, prints {@code CLOSED} and exits 0. Any failure exits
 * non-zero with the cause on stderr.
 */
public final class CuratorLatch {
    private static boolean joined = false;

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    /** Prints JOINED once, when the latch's node is known. */
    private static synchronized void joined(LeaderLatch latch) {
        String path = latch.getOurPath();
        if (!joined && path != null) {
            joined = true;
            say("JOINED " + path.substring(path.lastIndexOf('/') + 1));
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: CuratorLatch CONNECT_STRING LATCH_PATH PARTICIPANT_ID");
            System.exit(2);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new RetryOneTime(500))
                .build();
        client.start();
        if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
            System.err.println("not connected to " + args[0] + " within 60 s");
            System.exit(3);
        }
        LeaderLatch latch = new LeaderLatch(client, args[1], args[2]);
        latch.addListener(new LeaderLatchListener() {
            @Override
            public void isLeader() {
                joined(latch);
                say("LEADER " + System.currentTimeMillis());
            }

            @Override
            public void notLeader() {
                say("NOT_LEADER");
            }
        });
        latch.start();
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (latch.getOurPath() == null) {
            if (System.nanoTime() > until) {
                System.err.println("the latch created no node within 60 s");
                System.exit(4);
            }
            Thread.sleep(10);
        }
        joined(latch);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line = in.readLine(); line != null && !line.equals("close"); line = in.readLine()) {
            switch (line) {
                case "has":
                    say("HAS " + latch.hasLeadership());
                    break;
                case "leader":
                    Participant leader = latch.getLeader();
                    say(leader.isLeader() ? "LEADER_ID " + leader.getId() : "NO_LEADER");
                    break;
                default:
                    System.err.println("unknown command " + line);
                    System.exit(5);
            }
        }
        latch.close();
        say("CLOSED");
        client.close();
        // Curator's background threads must not keep the JVM alive.
        System.exit(0);
    }
}
