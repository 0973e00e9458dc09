//! `idem serve`'s metrics: behind the admin token or on their own address, bounded
//! labels, no database read per scrape.
//!
//! The `idem` binary in its own process on a fresh SQLite file, spoken to by a real HTTP
//! client (and by raw TCP where a client misbehaves). Each test has its own directory and
//! ports (the server binds 127.0.0.1:0 and says where); a process still running at the
//! end is killed.

use serde_json::json;

mod common;

use common::serve::*;

// ---------------------------------------------------------------------------------------
// Item 9: metrics behind the admin token, bounded labels, no database per scrape

#[test]
fn metrics_need_the_admin_token_and_carry_no_user_data() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(&db, &["--api-key", &key, "--admin-token", ADMIN], &[]);
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let frozen = post(
            &http,
            s.url("/v1/admin/freezes"),
            ADMIN,
            None,
            &json!({"scope": "user:alice@example.com", "what": "ticketing", "tenant": "t"}),
        )
        .await;
        assert_eq!(frozen.status, 201, "{}", frozen.text);

        let open = get(&http, s.url("/metrics"), None).await;
        assert_eq!(open.status, 401, "{}", open.text);
        let tenant = get(&http, s.url("/metrics"), Some(KEY)).await;
        assert_eq!(tenant.status, 401, "a tenant key is not the admin token");
        let admin = get(&http, s.url("/metrics"), Some(ADMIN)).await;
        assert_eq!(admin.status, 200, "{}", admin.text);
        let text = &admin.text;
        assert!(
            text.contains("idem_orders_freeze_active{scope_kind=\"user\",what=\"ticketing\"} 1"),
            "{text}"
        );
        assert!(!text.contains("alice"), "a user id in the metrics:\n{text}");
        assert!(!text.contains("tenant=\""), "{text}");
        // The alert rules read the service's series under the names exported here.
        let rules = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/alerts/idem-alerts.yml"
        ))
        .unwrap();
        let referenced: Vec<&str> = rules
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("idem_orders_") || w.starts_with("idem_http_"))
            .collect();
        assert!(referenced.len() >= 3, "{referenced:?}");
        for series in referenced {
            // A labelled counter has no sample before its first increment; its family
            // is declared all the same.
            let family = series.strip_suffix("_total").unwrap_or(series);
            assert!(
                text.contains(&format!("{series} "))
                    || text.contains(&format!("{series}{{"))
                    || text.contains(&format!("# TYPE {family} counter")),
                "{series} is not exported:\n{text}"
            );
        }
        assert!(
            text.contains("idem_orders_processing_past_lease 0"),
            "{text}"
        );
    });
}

#[test]
fn metrics_listen_serves_metrics_only_without_credentials() {
    let db = db();
    let key = format!("t={KEY}");
    let s = Serve::start(
        &db,
        &["--api-key", &key, "--metrics-listen", "127.0.0.1:0"],
        &[],
    );
    let internal = s.metrics_addr.clone().expect("metrics address printed");
    let rt = runtime();
    let http = client();
    rt.block_on(async {
        let scraped = get(&http, format!("http://{internal}/metrics"), None).await;
        assert_eq!(scraped.status, 200, "{}", scraped.text);
        assert!(
            scraped.text.contains("idem_orders_freeze_active"),
            "{}",
            scraped.text
        );
        let other = get(&http, format!("http://{internal}/v1/orders"), Some(KEY)).await;
        assert_eq!(other.status, 404, "the metrics address serves metrics only");
        // Without an admin token the main address has no metrics to give.
        let main = get(&http, s.url("/metrics"), None).await;
        assert_eq!(main.status, 403, "{}", main.text);
    });
}

/// In process, to take the database away under a running server: a scrape still
/// answers from the gauges the background refresh keeps.
#[test]
fn a_scrape_reads_no_database() {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime();
    rt.block_on(async {
        let server = idem_orders::bind(idem_orders::ServeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            database_url: Some(format!("sqlite://{}", dir.path().join("m.db").display())),
            api_keys: vec![format!("t={KEY}").parse().unwrap()],
            admin_token: Some(ADMIN.into()),
            ..idem_orders::ServeConfig::default()
        })
        .await
        .unwrap();
        let http = client();
        let base = server.url();
        let before = get(&http, format!("{base}/metrics"), Some(ADMIN)).await;
        assert_eq!(before.status, 200, "{}", before.text);
        server
            .orders()
            .database()
            .sqlite()
            .unwrap()
            .pool()
            .close()
            .await;
        let health = get(&http, format!("{base}/healthz"), None).await;
        assert_eq!(health.status, 503, "the database is gone");
        for _ in 0..3 {
            let after = get(&http, format!("{base}/metrics"), Some(ADMIN)).await;
            assert_eq!(after.status, 200, "{}", after.text);
            assert!(after.text.contains("idem_orders_outbox_unpublished"));
        }
        drop(server);
    });
}
