//! etcd: a cluster of 1 or 3 members on loopback ports.
//!
//! Members run with `--heartbeat-interval 50 --election-timeout 500` (milliseconds), so a
//! killed leader is replaced in about a second. Members are stopped with `SIGKILL` (etcd is
//! slow to stop on `SIGTERM`). Readiness is `GET /health` answering `"health":"true"`,
//! which etcd only does once the cluster has a leader and serves linearizable reads.
//!
//! A [secured](EtcdCluster::start_secured) cluster serves clients over TLS only and
//! requires client certificates (`--client-cert-auth`); its health is probed on a plain
//! metrics port instead.
//!
//! etcd is written in Go and reads the clock without libc: the
//! [clock shim](tenure_conformance::clock_shim) cannot shift it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tenure_conformance::servers::process::{CommandSpec, Probe, ServerProcess};
use tenure_conformance::servers::tls::{random_password, TestSecrets};
use tenure_conformance::servers::{
    find_binary, free_port, impl_node, kill_now, loopback, node_control_methods, poll_until,
    retry_on_port_clash, NodeCore, Result, ServerError,
};

const INSTALL: &str = "apt-get install -y etcd-server";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on finding a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on one HTTP request to a member.
const HTTP_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on one `etcdctl` call.
const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(15);

/// One etcd member.
#[derive(Debug)]
pub struct EtcdMember {
    core: NodeCore,
    name: String,
    /// The plain metrics listener of a secured member (its client port needs a client
    /// certificate).
    metrics: Option<SocketAddr>,
}

impl_node!(EtcdMember);

impl EtcdMember {
    node_control_methods!();

    /// The member's name (`m0`, `m1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Client URL, direct: `http://127.0.0.1:<port>` (`https://` when secured).
    pub fn endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr())
    }

    /// Client URL of the fault proxy in front of this member.
    pub fn proxied_endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.proxied_addr())
    }

    fn scheme(&self) -> &'static str {
        if self.metrics.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `(member_id, leader_id)` from `POST /v3/maintenance/status`, bounded by 1 s. Not
    /// on a secured member (its client port needs a client certificate).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn status(&self) -> Result<(u64, u64)> {
        if self.metrics.is_some() {
            return Err(ServerError::Unsupported {
                what: "the status of a secured etcd member".into(),
            });
        }
        let what = || format!("etcd {}", self.name);
        let body = tokio::time::timeout(
            HTTP_TIMEOUT,
            http(self.addr(), "POST", "/v3/maintenance/status", "{}"),
        )
        .await
        .map_err(|_| ServerError::Timeout {
            what: format!("{} to answer /v3/maintenance/status", what()),
        })??;
        let num = |key: &str| {
            json_field(&body, key)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| ServerError::Protocol {
                    what: what(),
                    detail: format!("no {key} in status reply {body:?}"),
                })
        };
        Ok((num("member_id")?, num("leader")?))
    }

    /// Whether the member says it is the leader (`etcd_server_is_leader` on `/metrics`,
    /// the plain metrics port of a secured member), bounded by 1 s.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn says_leader(&self) -> Result<bool> {
        let addr = self.metrics.unwrap_or_else(|| self.addr());
        let what = || format!("etcd {} to answer /metrics", self.name);
        let body = tokio::time::timeout(HTTP_TIMEOUT, http(addr, "GET", "/metrics", ""))
            .await
            .map_err(|_| ServerError::Timeout { what: what() })??;
        body.lines()
            .find_map(|line| line.strip_prefix("etcd_server_is_leader "))
            .map(|v| v.trim() == "1")
            .ok_or_else(|| ServerError::Protocol {
                what: what(),
                detail: "no etcd_server_is_leader metric".into(),
            })
    }
}

/// An etcd cluster. Dropping it kills every member and deletes the data.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Arc<EtcdMember>>,
    secrets: Option<EtcdSecrets>,
    dir: tempfile::TempDir,
}

/// What clients of a [secured](EtcdCluster::start_secured) cluster need: its CA and the
/// passwords of users `tenure` and `stranger` (through `Deref`; the cluster creates users
/// at [`EtcdCluster::enable_auth`]), and the URLs that use them.
#[derive(Clone, Debug)]
pub struct EtcdSecrets {
    users: TestSecrets,
}

impl std::ops::Deref for EtcdSecrets {
    type Target = TestSecrets;

    fn deref(&self) -> &TestSecrets {
        &self.users
    }
}

impl EtcdSecrets {
    /// A URL of user `tenure` on prefix `tenure` with the TLS options; `hosts` is
    /// `h:p,…` or a harness template's `{hosts}`.
    pub fn url(&self, hosts: &str) -> String {
        format!(
            "etcds://tenure:{}@{hosts}/tenure?{}",
            self.password,
            self.tls_options()
        )
    }
}

impl EtcdCluster {
    /// Start `members` members (1 or 3; any positive number works) as a new cluster and
    /// wait until every member reports healthy, which implies an elected leader.
    ///
    /// # Cancel safety
    /// Cancel safe: members started so far are killed when the future is dropped.
    pub async fn start(members: usize) -> Result<EtcdCluster> {
        if members == 0 {
            return Err(ServerError::Unsupported {
                what: "an etcd cluster needs at least one member".into(),
            });
        }
        retry_on_port_clash(|| Self::try_start(members, false)).await
    }

    /// Like [`start`](Self::start), but members serve clients over TLS only (certificates
    /// from a throwaway CA made now, in [`secrets`](Self::secrets)) and require a client
    /// certificate that CA signed (`--client-cert-auth`). Authentication is not enabled
    /// until [`enable_auth`](Self::enable_auth); passwords are hashed at bcrypt's lowest
    /// cost (`--bcrypt-cost 4`: they are throwaway). Members are probed on a plain metrics
    /// port (`/health`); [`EtcdMember::status`] does not work, and
    /// [`leader_index`](Self::leader_index) asks each member's metrics instead.
    ///
    /// # Cancel safety
    /// Cancel safe: members started so far are killed when the future is dropped.
    pub async fn start_secured(members: usize) -> Result<EtcdCluster> {
        if members == 0 {
            return Err(ServerError::Unsupported {
                what: "an etcd cluster needs at least one member".into(),
            });
        }
        retry_on_port_clash(|| Self::try_start(members, true)).await
    }

    async fn try_start(n: usize, secured: bool) -> Result<EtcdCluster> {
        let bin = find_binary("etcd", &[], INSTALL)?;
        let dir = tempfile::Builder::new().prefix("tenure-etcd-").tempdir()?;
        // Unique per cluster (the temp dir's name is "tenure-etcd-XXXXXX").
        let token = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tenure-etcd".into());
        let ports = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<Vec<(u16, u16)>>>()?;
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let secrets = match secured {
            true => Some(EtcdSecrets {
                users: TestSecrets::generate(&dir.path().join("pki"))?,
            }),
            false => None,
        };
        let scheme = if secured { "https" } else { "http" };
        let mut cluster = EtcdCluster {
            members: Vec::with_capacity(n),
            secrets,
            dir,
        };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let addr = loopback(client);
            let root = cluster.dir.path();
            let mut spec = CommandSpec::new(&bin)
                .cwd(root)
                .arg("--name")
                .arg(&name)
                .arg("--data-dir")
                .arg(root.join(&name))
                .arg("--listen-client-urls")
                .arg(format!("{scheme}://{addr}"))
                .arg("--advertise-client-urls")
                .arg(format!("{scheme}://{addr}"))
                .arg("--listen-peer-urls")
                .arg(format!("http://127.0.0.1:{peer}"))
                .arg("--initial-advertise-peer-urls")
                .arg(format!("http://127.0.0.1:{peer}"))
                .arg("--initial-cluster")
                .arg(&initial_cluster)
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--initial-cluster-token")
                .arg(&token)
                .arg("--heartbeat-interval")
                .arg("50")
                .arg("--election-timeout")
                .arg("500")
                .arg("--logger")
                .arg("zap")
                .arg("--log-outputs")
                .arg("stderr");
            let mut metrics = None;
            let probe: Probe = match &cluster.secrets {
                Some(secrets) => {
                    let addr = loopback(free_port()?);
                    metrics = Some(addr);
                    let pki = &secrets.pki;
                    spec = spec
                        .arg("--cert-file")
                        .arg(pki.server_cert())
                        .arg("--key-file")
                        .arg(pki.server_key())
                        .arg("--trusted-ca-file")
                        .arg(pki.ca())
                        .arg("--client-cert-auth")
                        // Throwaway passwords: the cheapest bcrypt, so that a loaded
                        // machine authenticates many clients at once in time (at the
                        // default cost 10, half of a matrix cell's 20 trials could not
                        // connect their holder within 2 s).
                        .arg("--bcrypt-cost")
                        .arg("4")
                        .arg("--listen-metrics-urls")
                        .arg(format!("http://{addr}"));
                    Arc::new(move |_| Box::pin(healthy(addr)))
                }
                None => Arc::new(|addr| Box::pin(healthy(addr))),
            };
            let process = ServerProcess::new(
                format!("etcd {name} on {addr}"),
                spec,
                root.join(format!("{name}.log")),
                READY_TIMEOUT,
                addr,
                probe,
            );
            let member = EtcdMember {
                core: NodeCore::new(process).await?,
                name,
                metrics,
            };
            member.core.process.spawn()?;
            cluster.members.push(Arc::new(member));
        }
        futures::future::try_join_all(cluster.members.iter().map(|m| m.core.process.wait_ready()))
            .await?;
        Ok(cluster)
    }

    /// The members, in start order.
    pub fn members(&self) -> &[Arc<EtcdMember>] {
        &self.members
    }

    /// Direct client URLs (`http://127.0.0.1:<port>`) of all members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint()).collect()
    }

    /// Client URLs of the fault proxies in front of all members.
    pub fn proxied_endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.proxied_endpoint()).collect()
    }

    /// The CA and passwords of a [secured](Self::start_secured) cluster.
    pub fn secrets(&self) -> Option<&EtcdSecrets> {
        self.secrets.as_ref()
    }

    /// The temporary directory holding every member's data and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Index (into [`members`](Self::members)) of the current leader. Waits up to 15 s for
    /// a leader that is itself running and answering, and that a responding member names;
    /// right after the leader dies the survivors still name it until they elect another.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn leader_index(&self) -> Result<usize> {
        if self.secrets.is_some() {
            return self.self_declared_leader().await;
        }
        let named = || async {
            let statuses = futures::future::join_all(self.members.iter().map(|m| async move {
                if m.is_running() && !m.is_paused() {
                    m.status().await.ok()
                } else {
                    None
                }
            }))
            .await;
            let ids: Vec<Option<u64>> = statuses.iter().map(|s| s.map(|(id, _)| id)).collect();
            let leader = statuses.iter().flatten().find_map(|&(_, leader)| {
                ids.iter().position(|id| *id == Some(leader) && leader != 0)
            });
            leader.ok_or(statuses)
        };
        poll_until(
            LEADER_TIMEOUT,
            Duration::from_millis(50),
            named,
            |statuses| format!("an etcd leader (statuses {statuses:?})"),
        )
        .await
    }

    /// [`leader_index`](Self::leader_index) on a secured cluster, whose client ports the
    /// harness cannot query: the only running member that says it leads (two say so
    /// only while a cut-off old leader has not yet stepped down).
    async fn self_declared_leader(&self) -> Result<usize> {
        let one_says = || async {
            let says = futures::future::join_all(self.members.iter().map(|m| async move {
                m.is_running() && !m.is_paused() && m.says_leader().await.unwrap_or(false)
            }))
            .await;
            let leaders: Vec<usize> = (0..says.len()).filter(|&i| says[i]).collect();
            match leaders[..] {
                [leader] => Ok(leader),
                _ => Err(says),
            }
        };
        poll_until(
            LEADER_TIMEOUT,
            Duration::from_millis(50),
            one_says,
            |says| format!("one etcd member saying it leads (said: {says:?})"),
        )
        .await
    }

    /// Creates a user and a role of the same name for each of `users`, the role granting
    /// `readwrite` on the key prefix, then a `root` user with a random password nobody
    /// learns, and enables authentication: the least privilege the README documents.
    /// Runs `etcdctl` over TLS with the client certificate of a
    /// [secured](Self::start_secured) cluster; each call is bounded by 15 s.
    ///
    /// # Cancel safety
    /// Not cancel safe: cancelled midway, some users exist and authentication is off.
    pub async fn enable_auth(&self, users: &[EtcdUser<'_>]) -> Result<()> {
        let secrets = self
            .secrets
            .as_ref()
            .ok_or_else(|| ServerError::Unsupported {
                what: "authentication on an etcd cluster without TLS".into(),
            })?;
        let root_password = random_password();
        // Each step's arguments, and the password `user add` reads on its stdin (never
        // on the command line, where `ps` would show it).
        let mut steps: Vec<(Vec<String>, Option<&str>)> = Vec::new();
        let words = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        for user in users {
            let name = user.name;
            steps.push((words(&["role", "add", name]), None));
            let grant = [
                "role",
                "grant-permission",
                name,
                "--prefix=true",
                "readwrite",
            ];
            let mut grant = words(&grant);
            grant.push(user.prefix.to_owned());
            steps.push((grant, None));
            let add = words(&["user", "add", name, "--interactive=false"]);
            steps.push((add, Some(user.password)));
            steps.push((words(&["user", "grant-role", name, name]), None));
        }
        steps.push((
            words(&["user", "add", "root", "--interactive=false"]),
            Some(&root_password),
        ));
        steps.push((words(&["role", "add", "root"]), None));
        steps.push((words(&["user", "grant-role", "root", "root"]), None));
        steps.push((words(&["auth", "enable"]), None));
        let bin = find_binary("etcdctl", &[], "apt-get install -y etcd-client")?;
        let pki = &secrets.pki;
        for (step, password) in steps {
            let what = || format!("etcdctl {}", step.join(" "));
            let run = async {
                let mut child = tokio::process::Command::new(&bin)
                    // The caller's ETCDCTL_* settings would add to (or fight) the flags.
                    .env_clear()
                    .arg(format!("--endpoints={}", self.endpoints().join(",")))
                    .arg(format!("--cacert={}", pki.ca().display()))
                    .arg(format!("--cert={}", pki.client_cert().display()))
                    .arg(format!("--key={}", pki.client_key().display()))
                    .args(&step)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()?;
                if let Some(mut stdin) = child.stdin.take() {
                    use tokio::io::AsyncWriteExt;
                    if let Some(password) = password {
                        stdin.write_all(format!("{password}\n").as_bytes()).await?;
                    }
                }
                child.wait_with_output().await
            };
            let out = tokio::time::timeout(ETCDCTL_TIMEOUT, run)
                .await
                .map_err(|_| ServerError::Timeout { what: what() })??;
            if !out.status.success() {
                return Err(ServerError::Protocol {
                    what: what(),
                    detail: format!(
                        "{}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A user for [`EtcdCluster::enable_auth`].
#[derive(Clone, Copy)]
pub struct EtcdUser<'a> {
    /// The user's (and its role's) name.
    pub name: &'a str,
    /// Its password.
    pub password: &'a str,
    /// The key prefix its role may read and write.
    pub prefix: &'a str,
}

impl std::fmt::Debug for EtcdUser<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        kill_now(self.members.iter().map(|m| &m.core));
    }
}

async fn healthy(addr: SocketAddr) -> Result<bool> {
    let body = http(addr, "GET", "/health", "").await?;
    Ok(body.replace(' ', "").contains(r#""health":"true""#))
}

/// A minimal HTTP/1.0 request (so the reply is neither chunked nor kept alive); returns
/// the body of a 2xx reply.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).await?;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with('2') {
        return Err(ServerError::Protocol {
            what: format!("etcd {addr} {method} {path}"),
            detail: format!("HTTP status {status:?}: {body}"),
        });
    }
    Ok(body.to_owned())
}

/// The first value of `"key":` in a JSON text, unquoted (enough for etcd's flat ids).
fn json_field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\"");
    let rest = &json[json.find(&pat)? + pat.len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    let end = rest.find(['"', ',', '}'])?;
    Some(rest[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::json_field;

    #[test]
    fn json_fields() {
        let j = r#"{"header":{"cluster_id":"1","member_id":"42","revision":"1"},"leader":"42","raftIndex":"3"}"#;
        assert_eq!(json_field(j, "member_id"), Some("42"));
        assert_eq!(json_field(j, "leader"), Some("42"));
        assert_eq!(json_field(j, "nope"), None);
    }
}
