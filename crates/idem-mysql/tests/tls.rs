//! TLS to MySQL / MariaDB: `ssl-mode` and `ssl-ca` in the URL, against a second
//! `mariadbd` started on a free port with its own datadir (under a temporary directory)
//! and certificates made here, killed at the end. A failure says which step failed and
//! what to do about it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_conformance::{fresh_tenant, request};
use idem_core::{Claim, ErrorKind, IdempotencyStore};
use idem_mysql::{MysqlOptions, MysqlStore};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

const INSTALL_DB: &str = "mariadb-install-db";
const MARIADBD: &str = "/usr/sbin/mariadbd";

/// A CA and a server certificate it signed for `names`, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn pki(dir: &Path, tag: &str, names: &[&str]) -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, format!("idem test CA {tag}"));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let mut leaf =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, names[0]);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf.signed_by(&leaf_key, &ca).unwrap();
    let write = |name: &str, pem: String| {
        let path = dir.join(format!("{tag}-{name}"));
        std::fs::write(&path, pem).unwrap();
        path
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        cert: write("server.pem", leaf.pem()),
        key: write("server.key", leaf_key.serialize_pem()),
    }
}

/// The side server; killed (and its datadir removed with the directory) when dropped.
struct SideServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for SideServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `mariadbd` with TLS from `server` on a fresh datadir; `None` after a visible
/// skip when MariaDB's binaries are not installed.
fn side_server(dir: tempfile::TempDir, server: &Pki) -> Option<SideServer> {
    if !Path::new(MARIADBD).exists() {
        idem_conformance::skip_or_fail("mariadbd (for the TLS server)", &MARIADBD);
        return None;
    }
    let data = dir.path().join("data");
    let install = Command::new(INSTALL_DB)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg("--auth-root-authentication-method=normal")
        .arg("--user=root")
        .arg("--skip-test-db")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match install {
        Ok(s) if s.success() => {}
        other => {
            idem_conformance::skip_or_fail("mariadb-install-db", &format!("{other:?}"));
            return None;
        }
    }
    let port = free_port();
    let child = Command::new(MARIADBD)
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .arg(format!("--socket={}", dir.path().join("sock").display()))
        .arg(format!("--pid-file={}", dir.path().join("pid").display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--user=root")
        .arg("--skip-log-bin")
        .arg(format!("--ssl-ca={}", server.ca.display()))
        .arg(format!("--ssl-cert={}", server.cert.display()))
        .arg(format!("--ssl-key={}", server.key.display()))
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(dir.path().join("mariadbd.log"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("start mariadbd");
    let server = SideServer {
        child,
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mariadbd did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(server)
}

fn options() -> MysqlOptions {
    {
        let mut o = MysqlOptions::default();
        o.max_connections = 1;
        o.acquire_timeout = Duration::from_secs(5);
        o
    }
}

async fn connect_err(url: &str) -> idem_core::StoreError {
    match MysqlStore::connect(url, options()).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => e,
    }
}

/// One server for every case (starting one takes seconds): REQUIRED encrypts,
/// VERIFY_CA checks the chain only, VERIFY_IDENTITY the host name too, an unknown CA
/// and a missing CA file are refused with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_modes_against_a_tls_server() {
    let dir = tempfile::tempdir().unwrap();
    // The server's certificate names a host that is not the address connected to.
    let ours = pki(dir.path(), "server", &["db.idem.invalid"]);
    let stranger = pki(dir.path(), "other", &["127.0.0.1"]);
    let (ca, other_ca) = (ours.ca.clone(), stranger.ca.clone());
    let Some(server) = side_server(dir, &ours) else {
        return;
    };
    let base = format!("mysql://root@127.0.0.1:{}/mysql", server.port);

    // REQUIRED: encrypted, nothing verified.
    let store = MysqlStore::connect(&format!("{base}?ssl-mode=REQUIRED"), options())
        .await
        .expect("ssl-mode=REQUIRED connects");
    let cipher: (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(!cipher.1.is_empty(), "the session is not encrypted");
    // The store's tables go in a database of their own (not the system one).
    sqlx::Executor::execute(store.pool(), "CREATE DATABASE idem_tls")
        .await
        .unwrap();
    let store = MysqlStore::connect(
        &format!(
            "mysql://root@127.0.0.1:{}/idem_tls?ssl-mode=REQUIRED",
            server.port
        ),
        options(),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let req = request(&fresh_tenant(), "k", "p", "o");
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Proceed(_)
    ));

    // VERIFY_CA with our CA: the chain checks out, the name is not looked at.
    let verify_ca = format!("{base}?ssl-mode=VERIFY_CA&ssl-ca={}", ca.display());
    MysqlStore::connect(&verify_ca, options())
        .await
        .expect("VERIFY_CA with the server's CA connects by address");
    // And through the facade's other spelling of the scheme.
    MysqlStore::connect(&verify_ca.replacen("mysql://", "mariadb://", 1), options())
        .await
        .expect("mariadb:// connects the same");

    // VERIFY_IDENTITY: trusted, but issued for another name than the one connected to.
    let e = connect_err(&format!(
        "{base}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        ca.display()
    ))
    .await;
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        e.to_string()
            .contains("TLS certificate verification failed"),
        "{e}"
    );
    assert!(e.to_string().contains("does not name the host"), "{e}");

    // Another CA: the chain is refused, and the message says to give the CA file.
    let e = connect_err(&format!(
        "{base}?ssl-mode=VERIFY_CA&ssl-ca={}",
        other_ca.display()
    ))
    .await;
    assert!(
        e.to_string()
            .contains("TLS certificate verification failed"),
        "{e}"
    );
    assert!(e.to_string().contains("CA file"), "{e}");

    // A CA file that is not there is named before any connection.
    let e = connect_err(&format!(
        "{base}?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/idem-ca.pem"
    ))
    .await;
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("/nonexistent/idem-ca.pem"), "{e}");
    drop(store);
    drop(server);
}
