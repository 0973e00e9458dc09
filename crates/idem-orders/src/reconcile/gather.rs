//! One survey of the ledgers: the scan, the facts of every duplicate cluster and the
//! plan. Both the run and its ledger checks read it.

use crate::db::Database;
use crate::error::Error;

use super::plan;
use super::scan::{self, Facts};
use super::{Action, Cluster, ReconcileOptions};

/// What one survey of the ledgers found and planned.
pub(crate) struct Survey {
    pub orders: u64,
    pub intents: u64,
    pub facts: Vec<Vec<Facts>>,
    pub clusters: Vec<Cluster>,
    pub actions: Vec<Action>,
}

pub(crate) async fn survey(db: &Database, o: &ReconcileOptions) -> Result<Survey, Error> {
    let scanned = scan::scan(db, o).await?;
    let mut facts = Vec::with_capacity(scanned.clusters.len());
    let mut clusters = Vec::with_capacity(scanned.clusters.len());
    let mut actions = Vec::new();
    if !scanned.clusters.is_empty() {
        let mut conn = db.acquire().await?;
        for (i, members) in scanned.clusters.into_iter().enumerate() {
            let mut f = Vec::with_capacity(members.len());
            for order in members {
                f.push(scan::facts(&mut conn.conn(), order).await?);
            }
            let (cluster, planned) = plan::plan(i, &f);
            facts.push(f);
            clusters.push(cluster);
            actions.extend(planned);
        }
    }
    Ok(Survey {
        orders: scanned.orders,
        intents: scanned.intents,
        facts,
        clusters,
        actions,
    })
}
