//! The fault schedule (a pure function of the seed and the campaign's shape) and its
//! injection into a running [`Topology`].
//!
//! Owns what each fault kind does to a process or link and for how long, and the record
//! of what was injected. Faults run one after another, each ending (continued,
//! restarted, link passing again) before the next starts, so the record says exactly
//! which fault was active when. It must not look at business rows beyond what picks a
//! target (the sweeper's lease holder) or describes the moment (pending work).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::db::{kill_sessions, Backend, Db};
use crate::proxy::Mode;
use crate::report::FaultEvent;
use crate::topology::{delete_prefix, Topology, CLAIM_LEASE, LEASE_TTL, SWEEP_LEASE};
use crate::ChaosError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Kill,
    Stop,
    Gateway,
    DbConn,
    Redis,
    Bus,
    Net,
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::Gateway,
        FaultKind::DbConn,
        FaultKind::Redis,
        FaultKind::Bus,
        FaultKind::Net,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Stop => "stop",
            FaultKind::Gateway => "gateway",
            FaultKind::DbConn => "db-conn",
            FaultKind::Redis => "redis",
            FaultKind::Bus => "bus",
            FaultKind::Net => "net",
        }
    }

    /// `kill,stop,…` or `all`.
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, ChaosError> {
        let mut kinds = Vec::new();
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                kinds.extend(FaultKind::ALL);
            } else {
                kinds.push(part.parse()?);
            }
        }
        kinds.sort();
        kinds.dedup();
        if kinds.is_empty() {
            return Err(ChaosError::Usage("--faults names no fault kind".into()));
        }
        Ok(kinds)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultKind {
    type Err = ChaosError;
    fn from_str(s: &str) -> Result<Self, ChaosError> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                ChaosError::Usage(format!(
                    "unknown fault kind {s:?} (kill, stop, gateway, db-conn, redis, bus, net or all)"
                ))
            })
    }
}

/// How a `net` fault treats the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetMode {
    Delay,
    Reset,
    Blackhole,
    DropResponse,
}

/// One planned fault. `pick` chooses among targets (modulo their count), `variant` among
/// a kind's forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub at: Duration,
    pub kind: FaultKind,
    pub pick: usize,
    pub variant: usize,
}

/// The schedule for a campaign of `duration`: every kind in `kinds` at least once, then
/// more at random, spread over the active phase. The same seed gives the same schedule.
pub fn schedule(seed: u64, duration: Duration, kinds: &[FaultKind]) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let start = Duration::from_millis(1_500);
    let end = duration.saturating_sub(Duration::from_secs(2)).max(start);
    // About one fault every 3 s, never fewer than one per kind.
    let slots = ((end - start).as_secs() / 3).max(kinds.len() as u64) as usize;
    let mut order: Vec<FaultKind> = kinds.to_vec();
    // Fisher–Yates by hand: the order must not depend on a library's shuffle.
    for i in (1..order.len()).rev() {
        let j = rng.random_range(0..=i);
        order.swap(i, j);
    }
    while order.len() < slots {
        order.push(kinds[rng.random_range(0..kinds.len())]);
    }
    let span = (end - start).as_millis() as u64;
    let step = span / slots as u64;
    order
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Planned {
            at: start + Duration::from_millis(i as u64 * step + rng.random_range(0..=step / 4)),
            kind,
            pick: rng.random_range(0..1_000),
            variant: rng.random_range(0..1_000),
        })
        .collect()
}

/// Runs `plan` against `topo` until `until` (campaign time), recording each fault.
pub struct Injector<'a> {
    pub topo: &'a mut Topology,
    pub started: Instant,
    pub events: Vec<FaultEvent>,
}

impl Injector<'_> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Past `until`, only kinds not yet injected still run: every kind asked for is
    /// injected at least once even when earlier faults took longer than planned.
    pub async fn run(&mut self, plan: &[Planned], until: Duration) -> Result<(), ChaosError> {
        let mut seen = std::collections::HashSet::new();
        for p in plan {
            let elapsed = self.started.elapsed();
            if elapsed >= until && seen.contains(&p.kind) {
                continue;
            }
            seen.insert(p.kind);
            if p.at > elapsed {
                tokio::time::sleep(p.at - elapsed).await;
            }
            let at_ms = self.now_ms();
            let (target, detail) = self.inject(p).await?;
            self.events.push(FaultEvent {
                at_ms,
                end_ms: self.now_ms().max(at_ms + 1),
                kind: p.kind.as_str().to_string(),
                target,
                detail,
            });
        }
        Ok(())
    }

    async fn inject(&mut self, p: &Planned) -> Result<(String, String), ChaosError> {
        let topo = &mut *self.topo;
        let services = topo.services.len();
        match p.kind {
            FaultKind::Kill | FaultKind::Bus => {
                let i = p.pick % services;
                let pending = if p.kind == FaultKind::Bus {
                    // Kill while the chain has work in flight, so deliveries go unacked.
                    wait_for_chain_work(&topo.db_url, Duration::from_secs(2)).await
                } else {
                    0
                };
                if p.kind == FaultKind::Kill {
                    // Answers written in the last 300 ms never reach a client: requests
                    // that committed die with the process before their response lands.
                    topo.to_service[i].set(Mode::DropResponse);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                let node = &mut topo.services[i];
                node.kill().await;
                topo.to_service[i].set(Mode::Pass);
                tokio::time::sleep(Duration::from_millis(400 + (p.variant % 600) as u64)).await;
                node.restarts += 1;
                node.start(&topo.bin, &topo.http).await?;
                let detail = if p.kind == FaultKind::Bus {
                    format!("SIGKILL with {pending} order(s) in the chain, restarted")
                } else {
                    "SIGKILL mid-load after 300 ms of committed work whose answers were lost, \
                     restarted"
                        .to_string()
                };
                Ok((node.name.clone(), detail))
            }
            FaultKind::Stop => {
                // Every other stop waits for a server whose sweeper holds the lease now.
                let holder = if p.variant % 2 == 1 {
                    live_sweeper_holder(topo, Duration::from_secs(3)).await
                } else {
                    None
                };
                let i = holder.as_ref().map_or(p.pick % services, |(i, _)| *i);
                let pause =
                    CLAIM_LEASE.max(SWEEP_LEASE).max(LEASE_TTL) + Duration::from_millis(1_500);
                let node = &topo.services[i];
                node.signal(libc::SIGSTOP);
                // Said as found after the stop: the run may have ended just before it.
                let why = match &holder {
                    Some((_, owner)) if holds_sweeper_lease(&topo.db_url, owner).await => {
                        "holding the sweeper's lease"
                    }
                    Some(_) => "its sweeper run ended just before the stop",
                    None if p.variant % 2 == 1 => "no sweeper run caught; a server",
                    None => "a server",
                };
                tokio::time::sleep(pause).await;
                node.signal(libc::SIGCONT);
                Ok((
                    node.name.clone(),
                    format!(
                        "SIGSTOP {} ms ({why}; claim lease {} ms), then SIGCONT",
                        pause.as_millis(),
                        CLAIM_LEASE.as_millis()
                    ),
                ))
            }
            FaultKind::Gateway => {
                let j = p.pick % topo.gateways.len();
                let node = &mut topo.gateways[j];
                node.kill().await;
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                node.restarts += 1;
                node.start(&topo.bin, &topo.http).await?;
                Ok((node.name.clone(), "SIGKILL, restarted after 1.5 s".into()))
            }
            FaultKind::DbConn => {
                let n = kill_sessions(&topo.db_url, &topo.db_name).await?;
                let how = match topo.backend {
                    Backend::Postgres => "pg_terminate_backend",
                    Backend::MySql => "KILL CONNECTION",
                };
                Ok((
                    topo.backend.name().into(),
                    format!("{how} on {n} connection(s)"),
                ))
            }
            FaultKind::Redis => {
                topo.to_redis.set(Mode::Reset);
                let deleted = delete_prefix(&topo.redis_url, &topo.redis_prefix).await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                topo.to_redis.set(Mode::Pass);
                Ok((
                    "redis".into(),
                    format!("connections reset, window dropped ({deleted} keys deleted)"),
                ))
            }
            FaultKind::Net => {
                let links = topo.to_service.len() + topo.to_database.len();
                let l = p.pick % links;
                let to_service = l < topo.to_service.len();
                let proxy = if to_service {
                    &topo.to_service[l]
                } else {
                    &topo.to_database[l - topo.to_service.len()]
                };
                // Every form on the link in turn, so one net fault covers them all;
                // dropping a response needs a request/response protocol: HTTP only.
                let forms: &[NetMode] = if to_service {
                    &[
                        NetMode::DropResponse,
                        NetMode::Delay,
                        NetMode::Reset,
                        NetMode::Blackhole,
                    ]
                } else {
                    &[NetMode::Delay, NetMode::Reset, NetMode::Blackhole]
                };
                let mut done = Vec::new();
                for form in forms {
                    let (mode, what) = match form {
                        NetMode::Delay => (Mode::Delay(Duration::from_millis(300)), "300 ms delay"),
                        NetMode::Reset => (Mode::Reset, "connection reset"),
                        NetMode::Blackhole => (Mode::Blackhole, "blackhole"),
                        NetMode::DropResponse => {
                            (Mode::DropResponse, "request forwarded, response dropped")
                        }
                    };
                    proxy.set(mode);
                    tokio::time::sleep(Duration::from_millis(800)).await;
                    done.push(what);
                }
                proxy.set(Mode::Pass);
                Ok((
                    proxy.name().to_string(),
                    format!("{}, 0.8 s each", done.join(", then ")),
                ))
            }
        }
    }
}

/// Orders whose automatic chain has not finished: paid but not ticketed yet, or
/// cancelled with their stock still held. The campaign's database is its own, so
/// every order counts.
pub(crate) async fn chain_work(c: &mut Db) -> Result<i64, sqlx::Error> {
    c.count(
        "SELECT count(*) FROM orders o WHERE o.status = 'paid' OR (o.status = 'cancelled' \
         AND EXISTS (SELECT 1 FROM inventory_holds h WHERE h.order_id = o.order_id \
         AND h.status = 'held'))",
        &[],
    )
    .await
}

/// Orders paid or cancelled whose chain step has not finished yet ([`chain_work`]);
/// waits up to `within` for there to be some.
async fn wait_for_chain_work(db_url: &str, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    let Ok(mut c) = Db::connect(db_url).await else {
        return 0;
    };
    let mut n = 0;
    while Instant::now() < deadline {
        n = chain_work(&mut c).await.unwrap_or(0) as u64;
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.close().await;
    n
}

/// The service whose sweeper holds the sweeper's lease right now (by the process id in
/// its owner name), polled for up to `within`; runs are short, so it is caught mid-run.
async fn live_sweeper_holder(topo: &Topology, within: Duration) -> Option<(usize, String)> {
    let mut c = Db::connect(&topo.db_url).await.ok()?;
    // A lease ends by a mark on PostgreSQL; on MySQL by an empty owner and its deadline
    // moved to the end (or by deleting its row), so the deadline alone tells.
    let live = match topo.backend {
        Backend::Postgres => "ended_at IS NULL AND",
        Backend::MySql => "",
    };
    let sql = format!(
        "SELECT owner FROM idem_leases WHERE name = 'idem.sweeper' AND {live} expires_at > {}",
        topo.backend.now_ms()
    );
    let deadline = Instant::now() + within;
    let mut found = None;
    while found.is_none() && Instant::now() < deadline {
        let owner = c.text(&sql, &[]).await.ok().flatten();
        found = owner.and_then(|owner| {
            let pid: u32 = owner
                .strip_prefix("sweeper-pid")?
                .split('-')
                .next()?
                .parse()
                .ok()?;
            let i = topo.services.iter().position(|s| s.pid() == Some(pid))?;
            Some((i, owner))
        });
        if found.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    c.close().await;
    found
}

async fn holds_sweeper_lease(db_url: &str, owner: &str) -> bool {
    let Ok(mut c) = Db::connect(db_url).await else {
        return false;
    };
    let sql = match c.backend() {
        Backend::Postgres => {
            "SELECT count(*) FROM idem_leases WHERE name = 'idem.sweeper' AND owner = $1 \
             AND ended_at IS NULL"
        }
        Backend::MySql => {
            "SELECT count(*) FROM idem_leases WHERE name = 'idem.sweeper' AND owner = $1"
        }
    };
    let held = c.count(sql, &[owner]).await.unwrap_or(0);
    c.close().await;
    held > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_with_every_kind() {
        let a = schedule(1, Duration::from_secs(25), &FaultKind::ALL);
        let b = schedule(1, Duration::from_secs(25), &FaultKind::ALL);
        assert_eq!(a, b);
        for kind in FaultKind::ALL {
            assert!(a.iter().any(|p| p.kind == kind), "{kind} missing");
        }
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a.iter().all(|p| p.at < Duration::from_secs(25)));
        assert_ne!(a, schedule(2, Duration::from_secs(25), &FaultKind::ALL));
    }

    #[test]
    fn fault_lists_parse_and_refuse_unknown_kinds() {
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), 7);
        assert_eq!(
            FaultKind::parse_list("net, kill,net").unwrap(),
            vec![FaultKind::Kill, FaultKind::Net]
        );
        assert!(FaultKind::parse_list("kill,flood").is_err());
        assert!(FaultKind::parse_list(" , ").is_err());
    }
}
