//! nginx as the bench's reference proxy: found (never installed) and run with a generated
//! `proxy_pass` configuration in a temporary prefix. Must not install or configure a system
//! nginx.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// Finds nginx: `options.nginx`, else `/usr/sbin/nginx` or `nginx` on `path` (the
/// `PATH` value). Never installs it: a missing nginx is a note in the report.
pub(crate) fn find_nginx(named: Option<&Path>, path: Option<OsString>) -> Result<PathBuf, String> {
    if let Some(p) = named {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!(
                "nginx {} does not exist; nginx figures skipped",
                p.display()
            ))
        };
    }
    let mut candidates = vec![PathBuf::from("/usr/sbin/nginx")];
    if let Some(path) = path {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nginx")));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "nginx not found (/usr/sbin/nginx, PATH); nginx figures skipped (install nginx to compare)"
            .to_string()
    })
}

/// nginx with a generated config, in a temporary prefix, killed when dropped. It runs as
/// a single process (`master_process off`): one event loop, like one worker, and nothing
/// left behind when the process is killed.
pub(crate) struct Nginx {
    pub(crate) addr: SocketAddr,
    child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    pub(crate) async fn start(binary: &Path, upstream: SocketAddr) -> Result<Nginx, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            l.local_addr().map_err(|e| e.to_string())?.port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let d = dir.path().display();
        let conf = format!(
            r#"worker_processes 1;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {d}/client_body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 10000000;
  upstream idem_bench_upstream {{
    server {upstream};
    keepalive 256;
    keepalive_requests 10000000;
  }}
  server {{
    listen {addr};
    location / {{
      proxy_pass http://idem_bench_upstream;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"#
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let mut child = tokio::process::Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if TcpStream::connect(addr).await.is_ok() {
                return Ok(Nginx {
                    addr,
                    child,
                    _dir: dir,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited with {status}: {}", log.trim()));
            }
            if Instant::now() > deadline {
                return Err("nginx did not start listening within 5 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Nginx {
    /// The process id, for its CPU clock (one process: `master_process off`).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // One process (master_process off), so killing it leaves no worker behind.
        let _ = self.child.start_kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nginx_is_a_note_never_an_install() {
        let none = find_nginx(None, Some(OsString::new()));
        if std::path::Path::new("/usr/sbin/nginx").is_file() {
            assert!(none.is_ok());
        } else {
            let note = none.unwrap_err();
            assert!(note.contains("nginx not found"), "{note}");
        }
        let note = find_nginx(Some(Path::new("/nonexistent/nginx")), None).unwrap_err();
        assert!(note.contains("does not exist"), "{note}");
    }
}
