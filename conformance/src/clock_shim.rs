//! A wall-clock shift for one server process (and every process it forks), by
//! `LD_PRELOAD`.
//!
//! libfaketime hangs Debian's jemalloc `redis-server`, so this crate ships its own tiny shim
//! (`shim/clockshift.c`): it overrides `clock_gettime` for `CLOCK_REALTIME` and
//! `CLOCK_REALTIME_COARSE`, `gettimeofday` and `time`, reading the real time with raw
//! syscalls and adding an offset in milliseconds read from the file named by
//! [`OFFSET_FILE_ENV`] (re-read at most every 10 ms; a missing file means no shift). Other
//! clocks (notably `CLOCK_MONOTONIC`) are untouched. Each time it reads a new offset it
//! records it, with its pid, for [`read_applied`]: evidence the process applies it.
//!
//! It only works for programs that read the clock through libc: Go programs (etcd) and the
//! JVM (ZooKeeper) bypass it, so clock faults are "not injectable" for them. A forking
//! server (Postgres) passes it to every process it forks; each reads the offset file on
//! its own next clock read.
//!
//! [`ClockShim::build`] compiles the shim once per process with the system `cc` into
//! `$TMPDIR/tenure-clockshift-<uid>/`, named by a hash of the source.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::servers::{Result, ServerError};

/// The C source of the shim.
pub const SOURCE: &str = include_str!("../shim/clockshift.c");

/// The environment variable naming the offset file read by the shim.
pub const OFFSET_FILE_ENV: &str = "TENURE_CLOCK_OFFSET_FILE";

/// The compiled shim, cached for the life of the process.
static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A compiled clock shim (`.so`), ready for `LD_PRELOAD`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockShim {
    path: PathBuf,
}

impl ClockShim {
    /// Compile the shim (once per process; concurrent callers wait for one build) and
    /// return it. Blocks for the compiler (~0.1 s); call it from `spawn_blocking` in async
    /// code. Fails with [`ServerError::MissingBinary`] when `cc` is not installed.
    pub fn build() -> Result<ClockShim> {
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = built.as_ref().filter(|p| p.is_file()) {
            return Ok(ClockShim { path: path.clone() });
        }
        let path = compile()?;
        *built = Some(path.clone());
        Ok(ClockShim { path })
    }

    /// [`build`](Self::build) off the async runtime's threads if `wanted`, else `None`: what
    /// a launcher starting its servers with or without the shim needs.
    ///
    /// # Cancel safety
    /// Cancel safe: a build under way finishes in the background (its result is cached).
    pub async fn build_if(wanted: bool) -> Result<Option<ClockShim>> {
        if !wanted {
            return Ok(None);
        }
        let built = tokio::task::spawn_blocking(ClockShim::build)
            .await
            .map_err(|e| ServerError::ShimBuild {
                detail: e.to_string(),
            })??;
        Ok(Some(built))
    }

    /// Path of the shared object.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A copy of the shim in `dir`, owned by `user` (`(uid, gid)`) where given: for a
    /// server that runs as a user who cannot read this process's private cache (Postgres
    /// runs as `postgres`).
    pub fn copy_to(&self, dir: &Path, user: Option<(u32, u32)>) -> Result<ClockShim> {
        let path = dir.join("clockshift.so");
        std::fs::copy(&self.path, &path)?;
        crate::servers::give_to(&path, user)?;
        Ok(ClockShim { path })
    }

    /// The environment a process needs to run under the shim, reading its offset from
    /// `offset_file`: `LD_PRELOAD` and [`OFFSET_FILE_ENV`].
    pub fn env(&self, offset_file: &Path) -> [(OsString, OsString); 2] {
        [
            ("LD_PRELOAD".into(), self.path.clone().into_os_string()),
            (OFFSET_FILE_ENV.into(), offset_file.as_os_str().to_owned()),
        ]
    }
}

impl ClockShim {
    /// Runs the process `spec` starts under the shim, its offset file `clock-offset-ms` in
    /// `dir` (at 0 to begin with): `spec` with the environment it needs, and the file.
    pub fn install(
        &self,
        dir: &Path,
        mut spec: crate::servers::process::CommandSpec,
    ) -> Result<(crate::servers::process::CommandSpec, OffsetFile)> {
        let file = dir.join("clock-offset-ms");
        write_offset(&file, 0)?;
        for (k, v) in self.env(&file) {
            spec = spec.env(k, v);
        }
        Ok((spec, OffsetFile(file)))
    }
}

/// `spec` run under `shim` if given, and its offset file: for a server that runs as `user`
/// (who cannot read this process's private cache), the shim is [copied](ClockShim::copy_to)
/// into the server's own directory `dir` first, where the offset file and the shim's
/// evidence live too.
pub fn install_copy(
    shim: Option<&ClockShim>,
    dir: &Path,
    user: Option<(u32, u32)>,
    spec: crate::servers::process::CommandSpec,
) -> Result<(crate::servers::process::CommandSpec, Option<OffsetFile>)> {
    match shim {
        Some(shim) => {
            let (spec, file) = shim.copy_to(dir, user)?.install(dir, spec)?;
            Ok((spec, Some(file)))
        }
        None => Ok((spec, None)),
    }
}

/// The offset file of one server run under the shim ([`ClockShim::install`]): where its
/// clock's shift is set and the shim's evidence read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetFile(PathBuf);

impl OffsetFile {
    /// Shifts the server's wall clock by `offset_ms` from real time (not cumulative; 0
    /// undoes it), within about 10 ms of its next clock read ([`write_offset`]).
    pub fn set(&self, offset_ms: i64) -> Result<()> {
        Ok(write_offset(&self.0, offset_ms)?)
    }

    /// The shim's evidence ([`read_applied`]): the offset last read, and the server's pid.
    pub fn applied(&self) -> Option<(i64, u32)> {
        read_applied(&self.0)
    }
}

/// [`OffsetFile::set`] on a server's offset file, or — for `what`, a server started
/// without the shim — [`ServerError::Unsupported`] saying it needs `needs`.
pub fn shift(file: Option<&OffsetFile>, what: &str, needs: &str, offset_ms: i64) -> Result<()> {
    let file = file.ok_or_else(|| ServerError::Unsupported {
        what: format!("{what}: clock offsets need {needs}"),
    })?;
    file.set(offset_ms)
}

/// Atomically set the offset (milliseconds, may be negative) read by the shim from
/// `offset_file`: write a temporary file next to it, readable by every user (a server may
/// run as another), then rename. Processes under the shim see the new offset within about
/// 10 ms.
pub fn write_offset(offset_file: &Path, offset_ms: i64) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = offset_file.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    writeln!(tmp, "{offset_ms}")?;
    tmp.persist(offset_file).map_err(|e| e.error)?;
    Ok(())
}

/// The shim's evidence for `offset_file`: the offset (ms) a process under the shim last
/// read from it, and the pid of the server the shim was loaded into (a process it forked
/// names it too). The shim writes `<offset file>.applied` each
/// time it reads an offset different from the one it recorded before. `None` until a
/// process has read the file.
pub fn read_applied(offset_file: &Path) -> Option<(i64, u32)> {
    let mut name = offset_file.as_os_str().to_owned();
    name.push(".applied");
    let text = std::fs::read_to_string(PathBuf::from(name)).ok()?;
    let mut fields = text.split_whitespace();
    let offset = fields.next()?.parse().ok()?;
    let pid = fields.next()?.parse().ok()?;
    Some((offset, pid))
}

/// FNV-1a, so that the cached file name depends only on the source.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A cache directory only we can write to.
fn cache_dir() -> Result<PathBuf> {
    let uid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("tenure-clockshift-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(ServerError::ShimBuild {
            detail: format!(
                "{} is not a directory owned by uid {uid} and writable only by it; \
                 remove it and retry",
                dir.display()
            ),
        });
    }
    Ok(dir)
}

fn compile() -> Result<PathBuf> {
    let cc = crate::servers::find_binary("cc", &[], "apt-get install -y gcc")?;
    let dir = cache_dir()?;
    let so = dir.join(format!("clockshift-{:016x}.so", fnv1a(SOURCE.as_bytes())));
    if so.is_file() {
        return Ok(so);
    }
    let src = dir.join(format!("clockshift-{}.c", std::process::id()));
    std::fs::write(&src, SOURCE)?;
    // Compile to a private name, then rename: concurrent builders (other test processes)
    // never see a half-written file.
    let tmp = tempfile::Builder::new()
        .prefix("clockshift-")
        .suffix(".so.tmp")
        .tempfile_in(&dir)?
        .into_temp_path();
    let out = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output();
    let _ = std::fs::remove_file(&src);
    let out = out?;
    if !out.status.success() {
        return Err(ServerError::ShimBuild {
            detail: format!(
                "{} exited with {}: {}",
                cc.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    tmp.persist(&so).map_err(|e| e.error)?;
    Ok(so)
}
