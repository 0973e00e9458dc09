//! A real process paused past its lease (SIGSTOP) and resumed (SIGCONT) has its write
//! fenced — the seed's "long GC pause" — on a SQLite file shared by two processes.
//!
//! The test binary runs twice: as the parent (no env var), and re-invoked by the parent
//! as the child (`IDEM_SIGSTOP_CHILD_DB` set). The child acquires a 1 s lease with the
//! keepalive on, writes once, checks its guard, reports `CHECKED`, and waits for a go
//! file before its second write — standing for a pause that falls between the check and
//! the write. The parent stops it, lets the lease run out by real time, acquires, writes,
//! creates the go file and resumes it. Unix only (uses `kill`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Lease, LeaseError, LeaseEventKind, LeaseName, LeaseStore, OwnerId, Release};
use idem_lease::{acquire_wait, Acquired, LeaseGuard, LeaseMetrics};
use idem_sqlite::{SqliteOptions, SqliteStore};

const CHILD_ENV: &str = "IDEM_SIGSTOP_CHILD_DB";
const LEASE: &str = "sigstop-inventory";
const RESOURCE: &str = "inventory:event-42";
const TTL: Duration = Duration::from_secs(1);

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    match std::env::var_os(CHILD_ENV) {
        Some(db) => std::process::exit(rt.block_on(child(PathBuf::from(db)))),
        None => {
            if cfg!(unix) {
                rt.block_on(parent());
                println!("test sigstop_paused_holder_is_fenced ... ok");
            } else {
                println!("test sigstop_paused_holder_is_fenced ... skipped (not unix)");
            }
        }
    }
}

async fn write(store: &SqliteStore, lease: &Lease, value: &str) -> Result<(), LeaseError> {
    let value = value.to_owned();
    let token = lease.token.get();
    store
        .fenced_write(RESOURCE, lease, move |tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO protected (id, value, token) VALUES (1, ?, ?) \
                             ON CONFLICT (id) DO UPDATE SET value = excluded.value, token = excluded.token")
                    .bind(value)
                    .bind(token)
                    .execute(tx)
                    .await
                    .map_err(|e| LeaseError::Backend(e.to_string()))?;
                Ok(())
            })
        })
        .await
}

/// The paused holder. Prints facts for the parent; exits 0 unless something broke.
async fn child(db: PathBuf) -> i32 {
    let store = Arc::new(SqliteStore::open_path(&db).await.expect("child open"));
    let name = LeaseName::new(LEASE).unwrap();
    let acquired = LeaseGuard::acquire(
        store.clone(),
        &name,
        &OwnerId::new("child").unwrap(),
        TTL,
        Duration::from_secs(5),
        LeaseMetrics::default(),
    )
    .await
    .expect("child acquire");
    let Acquired::Guard(guard) = acquired else {
        println!("BUSY");
        return 2;
    };
    let lease = guard.check().expect("fresh guard is valid");
    write(&store, &lease, "child-before-pause")
        .await
        .expect("first write");
    println!("CHECKED {}", lease.token);

    let go = db.with_extension("go");
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Resumed: the write goes out with the token checked before the pause.
    match write(&store, &lease, "child-after-pause").await {
        Ok(()) => println!("WRITE accepted"),
        Err(e) if e.is_fenced() => println!("WRITE fenced"),
        Err(e) => println!("WRITE error {e}"),
    }
    println!("VALID {}", guard.is_valid());
    match guard.release().await {
        Ok(Release::NotHolder { .. }) => println!("RELEASE not_holder"),
        Ok(Release::Released { .. }) => println!("RELEASE released"),
        Err(e) => println!("RELEASE error {e}"),
    }
    0
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// Kills the child if the parent fails half-way.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            signal(self.0.id(), "-CONT");
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Whether the parent can take SQLite's write lock now: a child stopped inside a write
/// transaction (a renewal) would hold it until resumed.
async fn write_lock_free(db: &Path) -> bool {
    let mut opts = SqliteOptions::new(db);
    opts.busy_timeout = Duration::from_millis(200);
    let probe = SqliteStore::open(opts).await.expect("probe open");
    let free = probe.begin().await.is_ok();
    probe.pool().close().await;
    free
}

async fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let store = SqliteStore::open_path(&db).await.unwrap();
    sqlx::query("CREATE TABLE protected (id INTEGER PRIMARY KEY, value TEXT NOT NULL, token INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();

    let child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ENV, &db)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut child = Reaper(child);
    let pid = child.0.id();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let child_token: i64 = loop {
        let line = lines.next().expect("child output ended early").unwrap();
        if let Some(t) = line.strip_prefix("CHECKED ") {
            break t.parse().unwrap();
        }
        assert_ne!(line, "BUSY");
    };

    // Stop it; if the stop caught a renewal mid-transaction, let it finish and retry.
    let mut tries = 0;
    loop {
        signal(pid, "-STOP");
        if write_lock_free(&db).await {
            break;
        }
        tries += 1;
        assert!(tries < 20, "the child keeps the write lock");
        signal(pid, "-CONT");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    // Paused past its lease: the store's clock lets the parent in with a higher token.
    let name = LeaseName::new(LEASE).unwrap();
    let mine = acquire_wait(
        &store,
        &name,
        &OwnerId::new("parent").unwrap(),
        Duration::from_secs(30),
        Duration::from_secs(10),
    )
    .await
    .unwrap()
    .granted()
    .expect("the stopped child's lease expires");
    assert!(mine.token.get() > child_token);
    write(&store, &mine, "parent").await.unwrap();

    std::fs::write(db.with_extension("go"), b"").unwrap();
    signal(pid, "-CONT");
    let out: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.0.wait().unwrap();
    assert!(status.success(), "child {status:?}: {out:?}");
    assert!(out.contains(&"WRITE fenced".to_string()), "{out:?}");
    assert!(out.contains(&"VALID false".to_string()), "{out:?}");
    assert!(out.contains(&"RELEASE not_holder".to_string()), "{out:?}");

    let (value, token): (String, i64) =
        sqlx::query_as("SELECT value, token FROM protected WHERE id = 1")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((value.as_str(), token), ("parent", mine.token.get()));
    let events = store.events(&name, 100).await.unwrap();
    let fenced: Vec<_> = events
        .iter()
        .filter(|e| e.kind == LeaseEventKind::FencedWriteRejected)
        .collect();
    assert_eq!(fenced.len(), 1, "{events:?}");
    assert_eq!(fenced[0].owner.as_ref().map(OwnerId::as_str), Some("child"));
    assert_eq!(fenced[0].token.map(|t| t.get()), Some(child_token));
    assert!(events.iter().any(
        |e| e.kind == LeaseEventKind::Expired && e.token.map(|t| t.get()) == Some(child_token)
    ));
    assert!(events
        .iter()
        .any(|e| e.kind == LeaseEventKind::ReleaseOwnerMismatch));
    assert_eq!(store.show(&name).await.unwrap().holder, Some(mine));
}
