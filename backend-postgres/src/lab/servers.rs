//! Postgres: one server in a fresh data directory.
//!
//! `initdb` (trust authentication, user `postgres`, `--no-sync`) runs into a temporary
//! directory; the server listens on `127.0.0.1:<port>` with its Unix socket inside the same
//! directory, `fsync=on` and `synchronous_commit=on`, so a committed transaction survives a
//! crash. Its dynamic shared memory is files in the data directory
//! (`dynamic_shared_memory_type=mmap`), so nothing outlives the handle in `/dev/shm`, even
//! after a `SIGKILL`. When running as root, `initdb` and `postgres` run as the `postgres`
//! user (initdb refuses root); the PID held is the postmaster's own.
//!
//! A [secured](Postgres::start_secured) server requires TLS with a client certificate and
//! a SCRAM password on TCP (`hostssl` only); the harness's own `psql` uses the Unix socket.
//!
//! Binaries are looked up in `PATH`, then in the newest `/usr/lib/postgresql/*/bin`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::clock_shim::{self, ClockShim, OffsetFile};
use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::tls::TestSecrets;
use tenure_conformance::servers::{
    find_binary, free_port, give_to, impl_node, loopback, node_control_methods,
    retry_on_port_clash, run_as, NodeCore, Result, ServerError,
};

pub(super) const INSTALL: &str = "apt-get install -y postgresql";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PSQL_TIMEOUT: Duration = Duration::from_secs(15);

/// A Postgres server. Dropping it kills the server and deletes the data.
///
/// [`restart`](Self::restart) behaves like `pg_ctl restart -m immediate`: the postmaster
/// and all its backends are killed with `SIGKILL`, then the server starts again on the same
/// data directory and runs crash recovery; committed transactions survive.
#[derive(Debug)]
pub struct Postgres {
    core: NodeCore,
    bin_dir: PathBuf,
    data: PathBuf,
    secrets: Option<PgSecrets>,
    /// The clock shim's offset file, with [`PgServerOptions::clock_shim`].
    offset_file: Option<OffsetFile>,
    dir: tempfile::TempDir,
}

/// How [`Postgres::start_with`] starts a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgServerOptions {
    /// Require TLS and a password (see [`Postgres::start_secured`]).
    pub secured: bool,
    /// Run the server under the [clock shim](tenure_conformance::clock_shim): the
    /// postmaster and every process it forks (each session's backend) read a wall clock
    /// shifted by [`Postgres::set_clock_offset`]. `now()`, `clock_timestamp()` and the
    /// server's timeouts follow it.
    pub clock_shim: bool,
}

/// The schema a [secured](Postgres::start_secured) server creates for the lock objects
/// (owned by `postgres`; user `tenure` gets only the grants its tests give it).
pub const SECURED_SCHEMA: &str = "locks";

/// What clients of a [secured](Postgres::start_secured) server need: its CA and the
/// passwords of roles `tenure` and `stranger` (through `Deref`), and the URLs that use them.
#[derive(Clone, Debug)]
pub struct PgSecrets {
    users: TestSecrets,
}

impl std::ops::Deref for PgSecrets {
    type Target = TestSecrets;

    fn deref(&self) -> &TestSecrets {
        &self.users
    }
}

impl PgSecrets {
    /// A URL of role `tenure` on schema [`SECURED_SCHEMA`] with the TLS options; `hosts` is
    /// `h:p` or a harness template's `{hosts}`.
    pub fn url(&self, hosts: &str) -> String {
        format!(
            "postgres://tenure:{}@{hosts}/postgres?schema={SECURED_SCHEMA}&{}",
            self.password,
            self.ssl_options()
        )
    }

    /// The TLS parameters of a client: verify the server against the CA (`verify-full`),
    /// and present the client certificate.
    pub fn ssl_options(&self) -> String {
        self.ssl_options_trusting(&self.pki.ca())
    }

    /// The same, trusting `ca` instead.
    pub fn ssl_options_trusting(&self, ca: &Path) -> String {
        format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            ca.display(),
            self.pki.client_cert().display(),
            self.pki.client_key().display()
        )
    }

    /// `pg_hba.conf`: the harness's superuser on the Unix socket only; everyone else over
    /// TLS from loopback, with a client certificate the CA signed and a SCRAM password.
    fn hba(&self) -> &'static str {
        "local all postgres trust\n\
         hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n"
    }

    /// The roles and the schema, run as `postgres` once the server is up.
    fn setup_sql(&self) -> String {
        format!(
            "SET password_encryption = 'scram-sha-256'; \
             CREATE ROLE tenure LOGIN PASSWORD '{}'; \
             CREATE ROLE stranger LOGIN PASSWORD '{}'; \
             CREATE SCHEMA {SECURED_SCHEMA}",
            self.password, self.stranger_password
        )
    }
}

impl_node!(
    Postgres,
    |node: &Postgres, offset_ms: i64| node.set_clock_offset(offset_ms),
    |node: &Postgres| node.clock_applied()
);

impl Postgres {
    node_control_methods!();

    /// `initdb` a fresh data directory, start the server and wait until `pg_isready`
    /// succeeds and `psql -c 'select 1'` works.
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start() -> Result<Postgres> {
        Self::start_with(PgServerOptions::default()).await
    }

    /// Like [`start`](Self::start), but the server requires TLS (`ssl=on`, `hostssl`
    /// only, certificates from a throwaway CA made now) with a client certificate, and a
    /// SCRAM password: roles `tenure` and `stranger` (passwords in
    /// [`secrets`](Self::secrets)) may log in, neither has any privilege yet, and schema
    /// [`SECURED_SCHEMA`] exists, owned by `postgres`. [`psql`](Self::psql) still works
    /// (as `postgres`, over the Unix socket).
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start_secured() -> Result<Postgres> {
        Self::start_with(PgServerOptions {
            secured: true,
            ..PgServerOptions::default()
        })
        .await
    }

    /// [`start`](Self::start) or [`start_secured`](Self::start_secured), as `options`
    /// say, under the clock shim if they ask for it.
    ///
    /// # Cancel safety
    /// Cancel safe: a server started so far is killed when the future is dropped.
    pub async fn start_with(options: PgServerOptions) -> Result<Postgres> {
        let shim = ClockShim::build_if(options.clock_shim).await?;
        retry_on_port_clash(|| Self::try_start(options.secured, shim.as_ref())).await
    }

    async fn try_start(secured: bool, shim: Option<&ClockShim>) -> Result<Postgres> {
        let bin_dir = bin_dir()?;
        let user = run_as("postgres", INSTALL)?;
        let dir = tempfile::Builder::new().prefix("tenure-pg-").tempdir()?;
        let root = dir.path().to_owned();
        give_to(&root, user)?;
        let data = root.join("data");
        initdb(&bin_dir, &root, &data, user).await?;
        let secrets = match secured {
            true => Some(PgSecrets {
                users: TestSecrets::generate(&root.join("pki"))?,
            }),
            false => None,
        };

        let port = free_port()?;
        let addr = loopback(port);
        let mut spec = CommandSpec::new(bin_dir.join("postgres"))
            .cwd(&root)
            .user(user)
            .env("LC_ALL", "C")
            .arg("-D")
            .arg(&data)
            .arg("-p")
            .arg(port.to_string())
            .arg("-c")
            .arg("listen_addresses=127.0.0.1")
            .arg("-c")
            .arg(format!("unix_socket_directories={}", root.display()))
            .arg("-c")
            .arg("fsync=on")
            .arg("-c")
            .arg("synchronous_commit=on")
            .arg("-c")
            .arg("shared_buffers=16MB")
            // Dynamic shared memory as files in the data directory, deleted with it: POSIX
            // segments in /dev/shm outlive a SIGKILLed postmaster.
            .arg("-c")
            .arg("dynamic_shared_memory_type=mmap")
            .arg("-c")
            .arg("max_connections=300")
            .arg("-c")
            .arg("logging_collector=off");
        if let Some(secrets) = &secrets {
            std::fs::write(data.join("pg_hba.conf"), secrets.hba())?;
            let pki = &secrets.pki;
            for (setting, file) in [
                ("ssl_cert_file", pki.server_cert()),
                ("ssl_key_file", pki.server_key()),
                ("ssl_ca_file", pki.ca()),
            ] {
                // The server refuses a key it does not own (or root, with 0640).
                give_to(&file, user)?;
                spec = spec.arg("-c").arg(format!("{setting}={}", file.display()));
            }
            spec = spec.arg("-c").arg("ssl=on");
        }
        // The server runs as its own user: the shim, the offset file and the shim's
        // evidence live in its own directory.
        let (spec, offset_file) = clock_shim::install_copy(shim, &root, user, spec)?;
        let (probe_bins, probe_socket) = (bin_dir.clone(), root.clone());
        let probe: Probe =
            Arc::new(move |addr| Box::pin(ready(probe_bins.clone(), probe_socket.clone(), addr)));
        let process = ServerProcess::new(
            format!("postgres on {addr}"),
            spec,
            root.join("postgres.log"),
            READY_TIMEOUT,
            addr,
            probe,
        )
        .movable_port("-p");
        let pg = Postgres {
            core: NodeCore::new(process).await?,
            bin_dir,
            data,
            secrets,
            offset_file,
            dir,
        };
        pg.core.process.start().await?;
        if let Some(secrets) = &pg.secrets {
            pg.psql(&secrets.setup_sql()).await?;
        }
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, direct.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }

    /// The same through the fault proxy.
    pub fn proxied_url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.proxied_addr())
    }

    /// The CA and passwords of a [secured](Self::start_secured) server.
    pub fn secrets(&self) -> Option<&PgSecrets> {
        self.secrets.as_ref()
    }

    /// Shifts the server's wall clock by `offset_ms` from real time (not cumulative; 0
    /// undoes it), for the postmaster and every backend, each within about 10 ms of its
    /// next clock read. [`ServerError::Unsupported`] unless started with
    /// [`PgServerOptions::clock_shim`].
    pub fn set_clock_offset(&self, offset_ms: i64) -> Result<()> {
        let what = self.core.process.what();
        let needs = "PgServerOptions::clock_shim";
        clock_shim::shift(self.offset_file.as_ref(), what, needs, offset_ms)?;
        // A connection makes the postmaster fork a backend, which reads the new offset at
        // its first clock read and records it: an idle server's own processes may not
        // read their clocks for many seconds. (Refused, it proves nothing: no matter.)
        let _ = std::net::TcpStream::connect_timeout(&self.addr(), Duration::from_secs(1));
        Ok(())
    }

    /// Evidence from the clock shim: the offset a server process last read, and the
    /// postmaster's pid (the shim records the process it was loaded into, which every
    /// backend forked from the postmaster inherits). `None` without the shim, or before a
    /// server process read its clock.
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

    /// Logs every statement from now on, each line prefixed with its session's application
    /// name (`app=tenure LOG:  statement: …`), to `postgres.log` in [`dir`](Self::dir):
    /// for tests that count what clients send.
    pub async fn log_statements(&self) -> Result<()> {
        for setting in [
            "ALTER SYSTEM SET log_statement = 'all'",
            "ALTER SYSTEM SET log_line_prefix = 'app=%a '",
            "SELECT pg_reload_conf()",
        ] {
            self.psql(setting).await?;
        }
        Ok(())
    }

    /// Run SQL as `postgres` with `psql -X -At` over the Unix socket and return its trimmed
    /// stdout; a failing statement is an error carrying psql's stderr. Bounded by 15 s.
    ///
    /// # Cancel safety
    /// Cancel safe: psql is killed if the future is dropped (the statement may or may not
    /// have run).
    pub async fn psql(&self, sql: &str) -> Result<String> {
        let psql = psql(&self.bin_dir, self.dir.path(), self.addr(), sql);
        tokio::time::timeout(PSQL_TIMEOUT, psql)
            .await
            .map_err(|_| ServerError::Timeout {
                what: format!("psql on {}: {sql}", self.addr()),
            })?
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.core.process.kill_now();
        remove_shared_memory(&self.data);
    }
}

/// A postmaster killed with `SIGKILL` leaves its small System V shared-memory segment
/// behind (a later start on the same data dir would remove it). Remove it with `ipcrm`,
/// using the id recorded in this data dir's `postmaster.pid`, so that runs do not
/// accumulate segments.
fn remove_shared_memory(data: &Path) {
    let Ok(pidfile) = std::fs::read_to_string(data.join("postmaster.pid")) else {
        return;
    };
    let Some(shmid) = pidfile
        .lines()
        .nth(6)
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u64>().ok())
    else {
        return;
    };
    let Ok(ipcrm) = find_binary("ipcrm", &[], "apt-get install -y util-linux") else {
        return;
    };
    let _ = std::process::Command::new(ipcrm)
        .arg("-m")
        .arg(shmid.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// The directory holding `initdb`, `postgres`, `pg_isready` and `psql`.
fn bin_dir() -> Result<PathBuf> {
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let e = e.ok()?;
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, e.path().join("bin")))
        })
        .collect();
    versioned.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
    let extra: Vec<PathBuf> = versioned.into_iter().map(|(_, p)| p).collect();
    let initdb = find_binary("initdb", &extra, INSTALL)?;
    // Follow symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb) to
    // the directory that holds the matching server and tools.
    let initdb = std::fs::canonicalize(&initdb).unwrap_or(initdb);
    let dir = initdb
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."));
    for bin in ["postgres", "pg_isready", "psql"] {
        if !dir.join(bin).is_file() {
            return Err(ServerError::MissingBinary {
                binary: dir.join(bin).display().to_string(),
                install: INSTALL.into(),
            });
        }
    }
    Ok(dir)
}

async fn initdb(bin_dir: &Path, root: &Path, data: &Path, user: Option<(u32, u32)>) -> Result<()> {
    let mut cmd = tokio::process::Command::new(bin_dir.join("initdb"));
    cmd.arg("-D")
        .arg(data)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ])
        .current_dir(root)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().await.map_err(|e| ServerError::Start {
        what: "initdb".into(),
        detail: e.to_string(),
    })?;
    let log = root.join("initdb.log");
    let _ = std::fs::write(&log, [&out.stdout[..], &out.stderr[..]].concat());
    if !out.status.success() {
        return Err(ServerError::Start {
            what: format!("initdb -D {}", data.display()),
            detail: format!(
                "exited with {}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// `pg_isready` over TCP (it needs no password), then `select 1` over the socket.
async fn ready(bin_dir: PathBuf, socket: PathBuf, addr: SocketAddr) -> Result<bool> {
    let status = tokio::process::Command::new(bin_dir.join("pg_isready"))
        .args(["-q", "-t", "1", "-U", "postgres", "-d", "postgres", "-h"])
        .arg(addr.ip().to_string())
        .arg("-p")
        .arg(addr.port().to_string())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await?;
    if !status.success() {
        return Ok(false);
    }
    Ok(psql(&bin_dir, &socket, addr, "select 1").await? == "1")
}

/// `psql` as `postgres` on the Unix socket in `socket` for the server on `addr`'s port.
async fn psql(bin_dir: &Path, socket: &Path, addr: SocketAddr, sql: &str) -> Result<String> {
    let out = tokio::process::Command::new(bin_dir.join("psql"))
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"])
        .args(["-U", "postgres", "-d", "postgres", "-h"])
        .arg(socket)
        .arg("-p")
        .arg(addr.port().to_string())
        .arg("-c")
        .arg(sql)
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        return Err(ServerError::Protocol {
            what: format!("psql on {addr}"),
            detail: format!(
                "{sql:?} failed with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
