//! A three-node Redis Cluster on side ports, started once per test process (the nodes
//! die with it) so the suites can run the record and lease scripts against it.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Each node's port, once the cluster serves all slots; `None` when `redis-server` or
/// `redis-cli` cannot run (the caller reports the skip).
pub fn ports() -> Result<&'static [u16; 3], String> {
    static CLUSTER: OnceLock<Result<[u16; 3], String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            // The nodes are spawned from a thread that outlives every test: a node's
            // parent-death signal fires when the spawning thread ends.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let started = start();
                let _ = tx.send(started);
                loop {
                    std::thread::park();
                }
            });
            rx.recv()
                .unwrap_or_else(|_| Err("cluster thread died".into()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// `redis+cluster://` naming every node as a seed.
pub fn url() -> Result<String, String> {
    let ports = ports()?;
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    Ok(format!("redis+cluster://{}", hosts.join(",")))
}

/// A port `p` with `p` and its cluster bus port `p + 10000` both free.
fn free_pair(taken: &[u16]) -> u16 {
    for _ in 0..200 {
        let p = idem_net::testing::free_port();
        if p > 55_000 || taken.contains(&p) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// Removes the node directories of earlier test processes that have exited.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("idem-cluster-")) else {
            continue;
        };
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn start() -> Result<[u16; 3], String> {
    remove_stale_dirs();
    let dir = std::env::temp_dir().join(format!("idem-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut ports = [0u16; 3];
    for i in 0..3 {
        ports[i] = free_pair(&ports[..i]);
        let node_dir = dir.join(ports[i].to_string());
        std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--cluster-enabled", "yes"])
            .arg("--port")
            .arg(ports[i].to_string())
            .args(["--save", "", "--appendonly", "no"])
            .arg("--cluster-config-file")
            .arg(node_dir.join("nodes.conf"))
            .arg("--dir")
            .arg(&node_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut cmd);
        cmd.spawn()
            .map_err(|e| format!("redis-server --cluster-enabled: {e}"))?;
    }
    for p in ports {
        wait_port(p)?;
    }
    let mut create = Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for p in ports {
        create.arg(format!("127.0.0.1:{p}"));
    }
    let out = create
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    // Every node must see every slot served before the suites start.
    let deadline = Instant::now() + Duration::from_secs(20);
    for p in ports {
        loop {
            let info = Command::new("redis-cli")
                .args(["-p", &p.to_string(), "CLUSTER", "INFO"])
                .output()
                .map_err(|e| e.to_string())?;
            if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the cluster node on {p} never reached cluster_state:ok"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(ports)
}

fn wait_port(port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("cluster node on {port} did not start"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The node gets SIGKILL when the thread that spawned it ends (here: the process).
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
