// Curator's InterProcessMutex, driven line by line from stdin by tenure's interop tests.
//
// Usage: java -cp <curator and zookeeper jars> CuratorLock.java HOSTS SESSION_TIMEOUT_MS PATH
// Commands: `acquire MILLIS` -> `acquired` | `timeout`; `release` -> `released`.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        int sessionMs = Integer.parseInt(args[1]);
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], sessionMs, 15000, new RetryOneTime(100));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + args[0]);
        }
        InterProcessMutex lock = new InterProcessMutex(client, args[2]);
        System.out.println("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line; (line = in.readLine()) != null; ) {
            String[] command = line.trim().split(" ");
            switch (command[0]) {
                case "acquire":
                    boolean got = lock.acquire(Long.parseLong(command[1]), TimeUnit.MILLISECONDS);
                    System.out.println(got ? "acquired" : "timeout");
                    break;
                case "release":
                    lock.release();
                    System.out.println("released");
                    break;
                default:
                    System.out.println("unknown command " + command[0]);
            }
        }
        client.close();
    }
}
