//! PgBouncer in front of a [`Postgres`] server: the connection pooler many deployments put
//! between clients and the server. It runs in session mode (a client keeps one server
//! connection for its session, as a held lock's transaction needs) and, as deployments
//! commonly configure it to accept clients such as sqlx, *drops* the startup parameters
//! it cannot track (`ignore_startup_parameters = extra_float_digits,options`): a client's
//! startup options (`-c setting=value`) never reach the server.
//!
//! Every role may log in without a password (`auth_type = trust`), on `127.0.0.1`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::{
    find_binary, free_port, give_to, loopback, retry_on_port_clash, run_as, Result,
};

use super::servers::Postgres;

const INSTALL: &str = "apt-get install -y pgbouncer";

/// A running PgBouncer; dropping it kills the process.
#[derive(Debug)]
pub struct PgBouncer {
    process: ServerProcess,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer for every database of `server`, serving the roles in `roles`,
    /// and waits until it accepts connections.
    ///
    /// # Cancel safety
    /// Cancel safe: a process started so far is killed when the future is dropped.
    pub async fn start(server: &Postgres, roles: &[&str]) -> Result<PgBouncer> {
        retry_on_port_clash(|| Self::try_start(server, roles)).await
    }

    async fn try_start(server: &Postgres, roles: &[&str]) -> Result<PgBouncer> {
        // Debian installs it in /usr/sbin, which a non-root PATH may lack.
        let binary = find_binary("pgbouncer", &["/usr/sbin".into()], INSTALL)?;
        let user = run_as("postgres", super::servers::INSTALL)?;
        let dir = tempfile::Builder::new()
            .prefix("tenure-pgbouncer-")
            .tempdir()?;
        let root = dir.path().to_owned();
        give_to(&root, user)?;
        let port = free_port()?;
        let addr = loopback(port);
        let users: String = roles.iter().map(|r| format!("\"{r}\" \"\"\n")).collect();
        std::fs::write(root.join("users.txt"), users)?;
        let upstream = server.addr();
        let config = format!(
            "[databases]\n\
             * = host={} port={}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {}\n\
             pool_mode = session\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             max_client_conn = 500\n\
             default_pool_size = 100\n",
            upstream.ip(),
            upstream.port(),
            root.join("users.txt").display(),
        );
        let ini = root.join("pgbouncer.ini");
        std::fs::write(&ini, config)?;
        let spec = CommandSpec::new(binary).cwd(&root).user(user).arg(&ini);
        let probe: Probe = Arc::new(|addr: SocketAddr| {
            Box::pin(async move { Ok(tokio::net::TcpStream::connect(addr).await.is_ok()) })
        });
        let process = ServerProcess::new(
            format!("pgbouncer on {addr}"),
            spec,
            root.join("pgbouncer.log"),
            Duration::from_secs(20),
            addr,
            probe,
        );
        process.start().await?;
        Ok(PgBouncer { process, _dir: dir })
    }

    /// The pooler's client address.
    pub fn addr(&self) -> SocketAddr {
        self.process.addr()
    }

    /// `postgres://<role>@<pooler>/postgres`.
    pub fn url(&self, role: &str) -> String {
        format!("postgres://{role}@{}/postgres", self.addr())
    }
}
