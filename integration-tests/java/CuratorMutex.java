import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

/**
 * One Apache Curator InterProcessMutex holder, for the interop tests in
 * integration-tests/tests/zookeeper.rs.
 *
 * <p>Usage: {@code CuratorMutex CONNECT_STRING LOCK_PATH}. Waits for the
 * mutex, prints {@code ACQUIRED <epoch millis>}, holds it until a line (or
 * end of input) arrives on stdin, releases it, prints {@code RELEASED} and
 * exits 0. Any failure exits non-zero with the cause on stderr, so the test
 * can tell a crash from a wait.
 */
public final class CuratorMutex {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: CuratorMutex CONNECT_STRING LOCK_PATH");
            System.exit(2);
        }
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 10_000, 10_000, new RetryOneTime(500))) {
            client.start();
            if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
                System.err.println("not connected to " + args[0] + " within 60 s");
                System.exit(3);
            }
            InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
            mutex.acquire();
            System.out.println("ACQUIRED " + System.currentTimeMillis());
            System.out.flush();
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            mutex.release();
            System.out.println("RELEASED");
            System.out.flush();
        }
        // Curator's background threads must not keep the JVM alive.
        System.exit(0);
    }
}
