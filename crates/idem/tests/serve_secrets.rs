//! `idem serve`'s secrets: off the command line (environment, files), checked at start,
//! warned about when in sight; its SQLite files private to their owner.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use std::time::Duration;

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// Item 11: secrets off the command line, checked, compared in constant time; private files

fn assert_not_on_the_command_line(s: &Serve) {
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.child.id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("secret-"),
        "a secret on the command line"
    );
}

#[test]
fn api_keys_from_the_environment() {
    let db = db();
    let s = Serve::start(
        &db,
        &[],
        &[
            ("IDEM_API_KEYS", "a=secret-from-env-1, t=secret-from-env-3"),
            ("IDEM_ADMIN_TOKEN", "admin-token-from-env-01"),
        ],
    );
    assert_not_on_the_command_line(&s);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        for token in ["secret-from-env-1", "secret-from-env-3"] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 200, "{token}: {}", r.text);
        }
        for token in [
            "secret-from-env",
            "secret-from-env-11",
            "a=secret-from-env-1",
        ] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 401, "{token}");
        }
        let r = get(
            &http,
            s.url("/v1/admin/freezes"),
            Some("admin-token-from-env-01"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    });
}

#[test]
fn api_keys_and_admin_token_from_files() {
    let db = db();
    let secrets = tempfile::tempdir().unwrap();
    let keys = private_file(
        secrets.path(),
        "keys",
        "# tenants of this server\n\nb=secret-from-file-2\n  # c=commented-out-key\n",
    );
    let admin = private_file(secrets.path(), "admin", "admin-token-from-file-01\n");
    let s = Serve::start(
        &db,
        &[
            "--api-keys-file",
            keys.to_str().unwrap(),
            "--admin-token-file",
            admin.to_str().unwrap(),
        ],
        &[("IDEM_API_KEYS", "a=secret-from-env-1")],
    );
    assert_not_on_the_command_line(&s);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        for token in ["secret-from-env-1", "secret-from-file-2"] {
            let r = get(&http, s.url("/v1/orders"), Some(token)).await;
            assert_eq!(r.status, 200, "{token}: {}", r.text);
        }
        let r = get(&http, s.url("/v1/orders"), Some("commented-out-key")).await;
        assert_eq!(r.status, 401);
        let r = get(
            &http,
            s.url("/v1/admin/freezes"),
            Some("admin-token-from-file-01"),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    });
}

#[test]
fn ambiguous_or_weak_secrets_are_refused_at_start() {
    let db = db();
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0", "--sweep-every", "0s"];
        all.extend_from_slice(args);
        refused(command(&db.url, &all, env))
    };

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=dup-secret-0001",
            "--api-key",
            "b=dup-secret-0001",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tenants a and b"), "{stderr}");
    assert!(
        !stderr.contains("dup-secret"),
        "the secret is echoed: {stderr}"
    );

    // A key source that holds no key is an error, not development mode.
    let (status, stderr) = serve(&[], &[("IDEM_API_KEYS", "")]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds no"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("keys");
    std::fs::write(&empty, "# no keys yet\n").unwrap();
    let (status, stderr) = serve(&["--api-keys-file", empty.to_str().unwrap()], &[]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds no"), "{stderr}");

    // Across sources too: the environment and the command line.
    let (status, stderr) = serve(
        &["--api-key", "a=dup-secret-0002"],
        &[("IDEM_API_KEYS", "b=dup-secret-0002")],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=secret-ok-0001",
            "--admin-token",
            "short-tok",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");
    assert!(!stderr.contains("short-tok"), "{stderr}");

    let (status, stderr) = serve(
        &["--api-key", "a=secret-ok-0001"],
        &[("IDEM_ADMIN_TOKEN", "fifteen-chars15")],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");

    let (status, stderr) = serve(
        &[
            "--api-key",
            "a=shared-with-admin-01",
            "--admin-token",
            "shared-with-admin-01",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
}

#[test]
fn sqlite_files_are_created_readable_by_their_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/sub/x.db");
    let db = Db {
        url: format!("sqlite://{}", path.display()),
        path: path.clone(),
        _dir: tempfile::tempdir().unwrap(),
    };
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key], &[]);
    let rt = runtime();
    rt.block_on(create_order(&client(), &s, "mode-1"));
    for file in ["x.db", "x.db-wal", "x.db-shm"] {
        let file = path.with_file_name(file);
        assert!(file.exists(), "{}", file.display());
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    assert_eq!(mode(&dir.path().join("data/sub")), 0o700);
}

// ---------------------------------------------------------------------------------------
// Secrets in sight

#[test]
fn a_secret_on_the_command_line_or_in_a_world_readable_config_warns_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let log = wait_for_log(&s, "shows in `ps`");
    assert!(
        log.contains("flag=\"--admin-token\"") && log.contains("flag=\"--api-key\""),
        "{log}"
    );
    assert!(!log.contains(ADMIN) && !log.contains(KEY), "{log}");
    drop(s);

    // From the environment: nothing in `ps`, no warning.
    let quiet = |s: &Serve| {
        std::thread::sleep(Duration::from_millis(300));
        let log = s.stderr();
        assert!(
            !log.contains("shows in `ps`") && !log.contains("holds secrets"),
            "{log}"
        );
    };
    let env = [("IDEM_API_KEYS", key.as_str()), ("IDEM_ADMIN_TOKEN", ADMIN)];
    quiet(&Serve::start(&db, &[], &env));

    // A config file holding the admin token, readable by every user.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    std::fs::write(
        &file,
        format!("admin_token = \"{ADMIN}\"\napi-key = [\"{key}\"]\n"),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = file.to_str().unwrap();
    let s = Serve::start(&db, &["--config", path], &[]);
    let log = wait_for_log(&s, "holds secrets");
    assert!(
        log.contains("admin_token") && log.contains("api-key") && log.contains("serve.toml"),
        "{log}"
    );
    assert!(!log.contains(ADMIN) && !log.contains(KEY), "{log}");
    assert!(
        !log.contains("shows in `ps`"),
        "the file is not the command line: {log}"
    );
    drop(s);
    // Readable by its group only (a service group): no warning.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    quiet(&Serve::start(&db, &["--config", path], &[]));
    // Readable by all, but no secret in it.
    std::fs::write(&file, "shutdown-grace = \"2s\"\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    quiet(&Serve::start(&db, &["--config", path], &env));
}
