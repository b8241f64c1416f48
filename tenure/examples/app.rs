//! An app whose lock backend is chosen only by configuration: the same binary runs on
//! Redis, Redlock, etcd, … depending on `TENURE_URL` (or a TOML file named by
//! `TENURE_CONFIG`).
//!
//! `TENURE_URL=redlock://h1:6379,h2:6379,h3:6379 cargo run -p tenure --example app`

use tenure::{Config, LockExt, LockKey};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let config = match std::env::var_os("TENURE_CONFIG") {
        Some(path) => Config::from_file(path.as_ref())?,
        None => Config::from_env()?,
    };
    let lock = config.connect().await?;
    let key = LockKey::new("example/app")?;
    let backend = lock.capabilities().backend;
    let token = lock
        .with_lock(&key, &config.acquire_options(), |token, _lost| async move {
            // The protected work: pass `token` to every write.
            token
        })
        .await?;
    println!("backend={backend} token={token}");
    Ok(())
}
