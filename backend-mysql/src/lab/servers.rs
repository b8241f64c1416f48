//! MariaDB: one server in a fresh data directory.
//!
//! `mariadb-install-db` (a passwordless `root`, no test database) runs into a temporary
//! directory; `mariadbd` listens on `127.0.0.1:<port>` with its Unix socket, pid file and
//! temporary files inside the same directory and reads no option file (`--no-defaults`).
//! InnoDB flushes its log at every commit, so a committed transaction survives a crash.
//! When running as root, both run as the `mysql` user. The server's own log (its stderr)
//! is `mariadb.log` in [`dir`](MariaDb::dir); `mariadb-install-db`'s is `install.log`.
//!
//! The host cache is off (`--host-cache-size=0`): connections cut before their handshake
//! (the readiness probe's, the fault proxy's) never get `127.0.0.1` blocked.
//!
//! A [secured](MariaDb::start_secured) server requires TLS on TCP, and its users a client
//! certificate the CA signed and a password; the harness's own client uses the Unix socket.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;

use tenure_conformance::clock_shim::{self, ClockShim, OffsetFile};
use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::tls::TestSecrets;
use tenure_conformance::servers::{
    find_binary, free_port, give_to, impl_node, loopback, node_control_methods,
    retry_on_port_clash, run_as, run_once, NodeCore, Result, ServerError,
};

const INSTALL: &str = "apt-get install -y mariadb-server mariadb-client";
const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SQL_TIMEOUT: Duration = Duration::from_secs(15);
const GREETING_TIMEOUT: Duration = Duration::from_secs(1);
/// The database every server creates, and the URLs name.
pub const DATABASE: &str = "tenure";

/// A MariaDB server. Dropping it kills the server and deletes the data.
///
/// [`restart`](Self::restart) kills the server with `SIGKILL` and starts it again on the
/// same data directory: InnoDB's crash recovery keeps every committed transaction.
#[derive(Debug)]
pub struct MariaDb {
    core: NodeCore,
    client: PathBuf,
    data: PathBuf,
    secrets: Option<MariaDbSecrets>,
    /// The clock shim's offset file, with [`MariaDbOptions::clock_shim`].
    offset_file: Option<OffsetFile>,
    dir: tempfile::TempDir,
}

/// How [`MariaDb::start_with`] starts a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MariaDbOptions {
    /// Require TLS, a client certificate and a password (see [`MariaDb::start_secured`]).
    pub secured: bool,
    /// Run the server under the [clock shim](tenure_conformance::clock_shim): `mariadbd`
    /// (one process, a thread per session) reads a wall clock shifted by
    /// [`MariaDb::set_clock_offset`]; `NOW()` and `SYSDATE()` follow it.
    pub clock_shim: bool,
}

/// What clients of a [secured](MariaDb::start_secured) server need: its CA, the client
/// certificate and the passwords of users `tenure` and `stranger` (through `Deref`), and
/// the URLs that use them.
#[derive(Clone, Debug)]
pub struct MariaDbSecrets {
    users: TestSecrets,
}

impl std::ops::Deref for MariaDbSecrets {
    type Target = TestSecrets;

    fn deref(&self) -> &TestSecrets {
        &self.users
    }
}

impl MariaDbSecrets {
    /// A URL of user `tenure` on database `tenure` with the TLS options; `hosts` is `h:p`
    /// or a harness template's `{hosts}`.
    pub fn url(&self, hosts: &str) -> String {
        format!(
            "mysql://tenure:{}@{hosts}/{DATABASE}?{}",
            self.password,
            self.ssl_options()
        )
    }

    /// The TLS parameters of a client (sqlx's): verify the server against the CA and its
    /// name (`VERIFY_IDENTITY`), and present the client certificate.
    pub fn ssl_options(&self) -> String {
        self.ssl_options_trusting(&self.pki.ca())
    }

    /// The same, trusting `ca` instead.
    pub fn ssl_options_trusting(&self, ca: &Path) -> String {
        format!(
            "ssl-mode=VERIFY_IDENTITY&ssl-ca={}&ssl-cert={}&ssl-key={}",
            ca.display(),
            self.pki.client_cert().display(),
            self.pki.client_key().display()
        )
    }

    /// Run as `root` once the server is up: `root` on the Unix socket only, and the two
    /// users, each requiring a certificate the CA signed.
    fn setup_sql(&self) -> String {
        format!(
            "DROP USER IF EXISTS 'root'@'127.0.0.1', 'root'@'::1'; \
             CREATE USER 'tenure'@'%' IDENTIFIED BY '{}' REQUIRE X509; \
             CREATE USER 'stranger'@'%' IDENTIFIED BY '{}' REQUIRE X509",
            self.password, self.stranger_password
        )
    }
}

impl_node!(
    MariaDb,
    |node: &MariaDb, offset_ms: i64| node.set_clock_offset(offset_ms),
    |node: &MariaDb| node.clock_applied()
);

impl MariaDb {
    node_control_methods!();

    /// `mariadb-install-db` a fresh data directory, start the server, wait until it greets
    /// on TCP and `select 1` works over its socket, and create database `tenure`.
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start() -> Result<MariaDb> {
        Self::start_with(MariaDbOptions::default()).await
    }

    /// Like [`start`](Self::start), but TCP clients must use TLS (certificates from a
    /// throwaway CA made now): users `tenure` and `stranger` (`'…'@'%'`, passwords in
    /// [`secrets`](Self::secrets)) log in with a client certificate the CA signed and
    /// their password, and have no privilege yet (so [`MariaDbSecrets::url`], which names
    /// database `tenure`, is refused until `tenure` is granted one on it). `root` can no
    /// longer log in over TCP;
    /// [`sql`](Self::sql) still works (as `root`, over the Unix socket).
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start_secured() -> Result<MariaDb> {
        Self::start_with(MariaDbOptions {
            secured: true,
            ..MariaDbOptions::default()
        })
        .await
    }

    /// [`start`](Self::start) or [`start_secured`](Self::start_secured), as `options`
    /// say, under the clock shim if they ask for it.
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start_with(options: MariaDbOptions) -> Result<MariaDb> {
        let shim = ClockShim::build_if(options.clock_shim).await?;
        retry_on_port_clash(|| Self::try_start(options.secured, shim.as_ref())).await
    }

    async fn try_start(secured: bool, shim: Option<&ClockShim>) -> Result<MariaDb> {
        let bins = Binaries::find()?;
        let user = run_as("mysql", INSTALL)?;
        let dir = tempfile::Builder::new()
            .prefix("tenure-mariadb-")
            .tempdir()?;
        let root = dir.path().to_owned();
        give_to(&root, user)?;
        let data = root.join("data");
        let install = shared_options(&bins.install_db, &root, &data)
            .user(user)
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .arg("--skip-name-resolve");
        run_once(
            "mariadb-install-db",
            &install,
            &root.join("install.log"),
            INSTALL_TIMEOUT,
        )
        .await?;
        let secrets = match secured {
            true => Some(MariaDbSecrets {
                users: TestSecrets::generate(&root.join("pki"))?,
            }),
            false => None,
        };

        let port = free_port()?;
        let addr = loopback(port);
        let mut spec = server_spec(&bins.server, &root, &data, port).user(user);
        if let Some(secrets) = &secrets {
            let pki = &secrets.pki;
            // The server reads its key as `mysql`.
            give_to(&pki.server_key(), user)?;
            for (option, file) in [
                ("--ssl-ca", pki.ca()),
                ("--ssl-cert", pki.server_cert()),
                ("--ssl-key", pki.server_key()),
            ] {
                spec = spec.arg(format!("{option}={}", file.display()));
            }
            spec = spec.arg("--require-secure-transport=ON");
        }
        let (spec, offset_file) = clock_shim::install_copy(shim, &root, user, spec)?;
        let (probe_client, probe_socket) = (bins.client.clone(), socket(&root));
        let probe: Probe =
            Arc::new(move |addr| Box::pin(ready(probe_client.clone(), probe_socket.clone(), addr)));
        let process = ServerProcess::new(
            format!("mariadb on {addr}"),
            spec,
            root.join("mariadb.log"),
            READY_TIMEOUT,
            addr,
            probe,
        )
        .movable_port("--port");
        let server = MariaDb {
            core: NodeCore::new(process).await?,
            client: bins.client,
            data,
            secrets,
            offset_file,
            dir,
        };
        server.core.process.start().await?;
        let mut setup = format!("CREATE DATABASE {DATABASE}");
        if let Some(secrets) = &server.secrets {
            setup = format!("{setup}; {}", secrets.setup_sql());
        }
        server.run_sql(None, &setup).await?;
        Ok(server)
    }

    /// `mysql://root@127.0.0.1:<port>/tenure`, direct (`root` has no password; refused by
    /// a [secured](Self::start_secured) server).
    pub fn url(&self) -> String {
        format!("mysql://root@{}/{DATABASE}", self.addr())
    }

    /// The same through the fault proxy.
    pub fn proxied_url(&self) -> String {
        format!("mysql://root@{}/{DATABASE}", self.proxied_addr())
    }

    /// The CA, client certificate and passwords of a [secured](Self::start_secured) server.
    pub fn secrets(&self) -> Option<&MariaDbSecrets> {
        self.secrets.as_ref()
    }

    /// Shifts the server's wall clock by `offset_ms` from real time (not cumulative; 0
    /// undoes it), within about 10 ms of its next clock read. [`ServerError::Unsupported`]
    /// unless started with [`MariaDbOptions::clock_shim`].
    pub fn set_clock_offset(&self, offset_ms: i64) -> Result<()> {
        let what = self.core.process.what();
        let needs = "MariaDbOptions::clock_shim";
        clock_shim::shift(self.offset_file.as_ref(), what, needs, offset_ms)?;
        // A connection makes the server read its clock, and the shim record the offset:
        // an idle server may not read it for a while. (Refused, it proves nothing.)
        let _ = std::net::TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1));
        Ok(())
    }

    /// Evidence from the clock shim: the offset the server last read, and its pid. `None`
    /// without the shim, or before the server read its clock.
    pub fn clock_applied(&self) -> Option<(i64, u32)> {
        self.offset_file.as_ref()?.applied()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The temporary directory holding the data directory, the Unix socket and the logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Run SQL (`;`-separated statements) as `root` on database `tenure` with the
    /// `mariadb` client in batch mode over the Unix socket, and return its trimmed stdout
    /// (tab-separated columns, no header); a failing statement is an error carrying the
    /// client's stderr. Bounded by 15 s.
    ///
    /// # Cancel safety
    /// Cancel safe: the client is killed if the future is dropped (the statements may or
    /// may not have run).
    pub async fn sql(&self, sql: &str) -> Result<String> {
        self.run_sql(Some(DATABASE), sql).await
    }

    async fn run_sql(&self, database: Option<&str>, sql: &str) -> Result<String> {
        let socket = socket(self.dir.path());
        let run = client(&self.client, &socket, database, sql);
        tokio::time::timeout(SQL_TIMEOUT, run)
            .await
            .map_err(|_| ServerError::Timeout {
                what: format!("{}: {sql}", self.core.process.what()),
            })?
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        // Before the directory goes (the fields drop after this).
        self.core.process.kill_now();
    }
}

/// `mariadbd`, `mariadb-install-db` and the `mariadb` client.
struct Binaries {
    server: PathBuf,
    install_db: PathBuf,
    client: PathBuf,
}

impl Binaries {
    /// Looked up in `PATH`, then where Debian installs them (`/usr/sbin` may not be in a
    /// user's `PATH`).
    fn find() -> Result<Binaries> {
        let usual = [PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")];
        Ok(Binaries {
            server: find_binary("mariadbd", &usual, INSTALL)?,
            install_db: find_binary("mariadb-install-db", &usual, INSTALL)?,
            client: find_binary("mariadb", &usual, INSTALL)?,
        })
    }
}

/// The server's Unix socket in its directory `root`.
fn socket(root: &Path) -> PathBuf {
    root.join("mysqld.sock")
}

/// `program` (`mariadbd`, or `mariadb-install-db`, which passes them on to the server it
/// bootstraps) in `root` with the options both take: no option file, the data directory,
/// temporary files in `root` (not `/tmp`, where concurrent servers' names may clash), and
/// small buffers, so that a server starts in a fraction of a second (the install makes the
/// log file, at its size).
fn shared_options(program: &Path, root: &Path, data: &Path) -> CommandSpec {
    CommandSpec::new(program)
        .cwd(root)
        // First, or it is not obeyed.
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--tmpdir={}", root.display()))
        .arg("--innodb-buffer-pool-size=32M")
        .arg("--innodb-log-file-size=8M")
}

/// `mariadbd` on `data` and `127.0.0.1:port`, everything else it writes in `root`.
fn server_spec(server: &Path, root: &Path, data: &Path, port: u16) -> CommandSpec {
    shared_options(server, root, data)
        .arg(format!("--socket={}", socket(root).display()))
        .arg(format!(
            "--pid-file={}",
            root.join("mariadbd.pid").display()
        ))
        .arg("--bind-address=127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--skip-name-resolve")
        .arg("--host-cache-size=0")
        .arg("--innodb-flush-log-at-trx-commit=1")
        .arg("--max-connections=500")
        // What Debian's packaged configuration sets (the compiled-in default is latin1).
        .arg("--character-set-server=utf8mb4")
        .arg("--collation-server=utf8mb4_general_ci")
}

/// The server greets on TCP (a frozen server's kernel still accepts connections), and
/// `select 1` works over the socket.
async fn ready(client_bin: PathBuf, socket: PathBuf, addr: SocketAddr) -> Result<bool> {
    if !greets(addr).await? {
        return Ok(false);
    }
    Ok(client(&client_bin, &socket, None, "select 1").await? == "1")
}

/// Whether the first packet on a fresh connection to `addr` is a protocol-10 handshake
/// (not an error packet, such as "too many connections"), within a second: whatever
/// else holds the port (a server that failed to start lost it) may never speak.
async fn greets(addr: SocketAddr) -> Result<bool> {
    let greeting = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        // A 3-byte length and a sequence number, then the protocol version.
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head[4] == 10)
    };
    match tokio::time::timeout(GREETING_TIMEOUT, greeting).await {
        Ok(greets) => Ok(greets?),
        Err(_) => Ok(false),
    }
}

/// The `mariadb` client as `root` on the Unix socket `socket`, in batch mode, on
/// `database` if given.
async fn client(bin: &Path, socket: &Path, database: Option<&str>, sql: &str) -> Result<String> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args([
        "--no-defaults",
        "--user=root",
        "--batch",
        "--skip-column-names",
    ])
    .arg("--connect-timeout=5")
    .arg(format!("--socket={}", socket.display()))
    .arg("--execute")
    .arg(sql);
    if let Some(database) = database {
        cmd.arg(database);
    }
    let out = cmd
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        return Err(ServerError::Protocol {
            what: format!("mariadb on {}", socket.display()),
            detail: format!(
                "{sql:?} failed with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
