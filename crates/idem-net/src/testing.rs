//! A throwaway public-key infrastructure for tests that start TLS servers: a CA, and a
//! server certificate it signed for `localhost` and `127.0.0.1`, as PEM files in a
//! directory removed on drop.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

pub struct TestPki {
    dir: tempfile::TempDir,
    /// The CA certificate a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (signed by `ca`) and its private key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestPki {
    /// Panics when generation fails: only for tests.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "idem test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let mut leaf =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("server parameters");
        leaf.distinguished_name
            .push(DnType::CommonName, "localhost");
        let leaf_key = KeyPair::generate().expect("server key");
        let leaf = leaf.signed_by(&leaf_key, &ca).expect("server certificate");
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        Self {
            ca: write("ca.pem", ca.pem()),
            cert: write("server.pem", leaf.pem()),
            key: write("server.key", leaf_key.serialize_pem()),
            dir,
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

/// A free TCP port on loopback (free when asked; a server started at once takes it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A server process a test started, killed and reaped on drop.
pub struct Spawned {
    child: std::process::Child,
    pub port: u16,
}

impl Spawned {
    /// Spawns `command` (output discarded) and waits up to 10 s for `port` to accept
    /// connections. An error means the program could not be started (not installed);
    /// one that starts but never listens panics (a broken test, never a skip).
    pub fn start(mut command: std::process::Command, port: u16) -> std::io::Result<Self> {
        use std::process::Stdio;
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let spawned = Self { child, port };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{command:?} did not listen on port {port} within 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(spawned)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
