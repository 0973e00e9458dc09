//! Two instances of the service on one database, as a fleet runs it: a double click
//! that lands on both at once is one order and two identical answers, never an error.

#[macro_use]
mod common;

use common::{Env, T1};

on_every_store!(a_double_click_across_two_instances_is_one_order);

/// 40 keys at once, each sent to both instances at the same moment: each key makes one order,
/// both sends get 201 with the same order (one of them a replay), none a 5xx.
async fn a_double_click_across_two_instances_is_one_order(env: Env) {
    let a = env.start().await;
    let b = env.start().await;
    let keys: Vec<String> = (0..40).map(|n| format!("both-{n}")).collect();
    let (ra, rb) = (&a, &b);
    let pairs = keys.iter().map(|key| async move {
        let (x, y) = tokio::join!(
            ra.create(T1, key, "U-1", "S-204", 1),
            rb.create(T1, key, "U-1", "S-204", 1)
        );
        (key, x, y)
    });
    for (key, x, y) in futures::future::join_all(pairs).await {
        assert_eq!(
            (x.status, y.status),
            (201, 201),
            "{key}: {} / {}",
            x.body,
            y.body
        );
        assert_eq!(x.order_id(), y.order_id(), "{key}: one order");
        assert!(x.replayed || y.replayed, "{key}: one of them is the replay");
    }
    let counts = a.server.orders().counts("t1").await.unwrap();
    assert_eq!(counts.orders, 40);
    a.shutdown().await;
    b.shutdown().await;
}
