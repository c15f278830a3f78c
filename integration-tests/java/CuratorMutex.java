import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.api.ACLProvider;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.retry.RetryOneTime;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.data.ACL;

/**
 * One Apache Curator lock holder, for the interop tests in
 * integration-tests/tests/zookeeper.rs.
 *
 * <p>Usage: {@code CuratorMutex [mutex|read|write] CONNECT_STRING LOCK_PATH
 * [USER:PASSWORD]}. The mode picks the recipe: {@code mutex} (the default)
 * an InterProcessMutex, {@code read} and {@code write} the read lock and the
 * write lock of an InterProcessReadWriteLock on the path. With credentials, the session authenticates with the {@code digest}
 * scheme and creates its nodes with the ACL "the creator may do
 * everything, anyone may read", as distlock does. Waits for the
 * mutex, prints {@code ACQUIRED <epoch millis>}, holds it until a line (or
 * end of input) arrives on stdin, releases it, prints {@code RELEASED} and
 * exits 0. Any failure exits non-zero with the cause on stderr, so the test
 * can tell a crash from a wait.
 */
public final class CuratorMutex {
    public static void main(String[] argv) throws Exception {
        String mode = "mutex";
        String[] args = argv;
        if (argv.length > 0 && List.of("mutex", "read", "write").contains(argv[0])) {
            mode = argv[0];
            args = Arrays.copyOfRange(argv, 1, argv.length);
        }
        if (args.length != 2 && args.length != 3) {
            System.err.println(
                    "usage: CuratorMutex [mutex|read|write] CONNECT_STRING LOCK_PATH [USER:PASSWORD]");
            System.exit(2);
        }
        CuratorFrameworkFactory.Builder builder = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new RetryOneTime(500));
        if (args.length == 3) {
            List<ACL> acl = new ArrayList<>(ZooDefs.Ids.CREATOR_ALL_ACL);
            acl.addAll(ZooDefs.Ids.READ_ACL_UNSAFE);
            builder.authorization("digest", args[2].getBytes(StandardCharsets.UTF_8))
                    .aclProvider(new ACLProvider() {
                        @Override
                        public List<ACL> getDefaultAcl() {
                            return acl;
                        }

                        @Override
                        public List<ACL> getAclForPath(String path) {
                            return acl;
                        }
                    });
        }
        try (CuratorFramework client = builder.build()) {
            client.start();
            if (!client.blockUntilConnected(60, TimeUnit.SECONDS)) {
                System.err.println("not connected to " + args[0] + " within 60 s");
                System.exit(3);
            }
            InterProcessMutex mutex;
            switch (mode) {
                case "read":
                    mutex = new InterProcessReadWriteLock(client, args[1]).readLock();
                    break;
                case "write":
                    mutex = new InterProcessReadWriteLock(client, args[1]).writeLock();
                    break;
                default:
                    mutex = new InterProcessMutex(client, args[1]);
            }
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
