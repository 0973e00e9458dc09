//! What a bench run was limited by, from the kernel's counters: the machine's CPU time
//! (busy, waiting on I/O) and this process's own (load generator and, in-process, the
//! server under test), sampled at the start and the end of a measurement.
//!
//! Owns reading `/proc/stat`, `/proc/self/stat` and one process's or thread's CPU time
//! ([`CpuClock`]), and the verdict drawn from them. It must not change how a bench runs.
//! Where the counters are not readable (not Linux) the verdict says so instead of
//! guessing.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Clock ticks per second of `/proc` CPU times (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;
/// At or above this share of all cores busy, the run was CPU-bound.
const CPU_BOUND: f64 = 0.9;
/// At or above this share of core time waiting on I/O, the run was waiting on the disk.
const IO_BOUND: f64 = 0.2;

/// What one measurement was limited by.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Saturation {
    /// Cores the machine has.
    pub cores: usize,
    /// Share of all cores' time that was busy (any process), 0–1.
    pub machine_cpu_busy: f64,
    /// Share of all cores' time spent waiting on I/O, 0–1.
    pub machine_iowait: f64,
    /// This process's CPU time per second of wall time, in cores.
    pub process_cores: f64,
    /// In words: `cpu (…)`, `disk (…)`, or the store's own limit.
    pub saturated: String,
}

#[derive(Debug, Clone, Copy)]
struct Machine {
    busy: u64,
    iowait: u64,
    total: u64,
}

/// A measurement in progress.
#[derive(Debug, Clone)]
pub struct Meter {
    started: Instant,
    machine: Option<Machine>,
    process: Option<u64>,
}

impl Meter {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            machine: machine(),
            process: process_ticks(),
        }
    }

    /// Ends the measurement; `limit` names what bounds the store when the CPU and the
    /// disk do not (e.g. "commits: SQLite's single writer").
    pub fn stop(&self, limit: &str) -> Saturation {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let (busy, iowait) = match (self.machine, machine()) {
            (Some(a), Some(b)) if b.total > a.total => {
                let total = (b.total - a.total) as f64;
                (
                    (b.busy - a.busy) as f64 / total,
                    (b.iowait - a.iowait) as f64 / total,
                )
            }
            _ => (f64::NAN, f64::NAN),
        };
        let process_cores = match (self.process, process_ticks()) {
            (Some(a), Some(b)) => (b.saturating_sub(a)) as f64 / USER_HZ / wall,
            _ => f64::NAN,
        };
        Saturation {
            cores,
            machine_cpu_busy: round(busy),
            machine_iowait: round(iowait),
            process_cores: round(process_cores),
            saturated: verdict(busy, iowait, process_cores, cores, limit),
        }
    }
}

fn verdict(busy: f64, iowait: f64, process_cores: f64, cores: usize, limit: &str) -> String {
    if busy.is_nan() {
        return format!("unknown (no /proc counters); {limit}");
    }
    if busy >= CPU_BOUND {
        let mine = process_cores / cores as f64;
        let who = if mine >= busy * 0.75 {
            "this process: load generator and server"
        } else {
            "mostly other processes: a database server, or other load on the machine"
        };
        format!(
            "cpu ({:.0}% of {cores} cores busy, {:.0}% in this process; {who})",
            busy * 100.0,
            mine * 100.0
        )
    } else if iowait >= IO_BOUND {
        format!("disk ({:.0}% of core time waiting on I/O)", iowait * 100.0)
    } else {
        format!("{limit} (cpu {:.0}% busy)", busy * 100.0)
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The first line of `/proc/stat`: user nice system idle iowait irq softirq steal.
fn machine() -> Option<Machine> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_stat(text.lines().next()?)
}

fn parse_stat(line: &str) -> Option<Machine> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.take(8).filter_map(|f| f.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let (idle, iowait) = (v[3], v[4]);
    Some(Machine {
        busy: total - idle - iowait,
        iowait,
        total,
    })
}

/// utime + stime of this process, in ticks (fields 14 and 15 of `/proc/self/stat`).
fn process_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_self_stat(&text)
}

fn parse_self_stat(text: &str) -> Option<u64> {
    parse_user_system(text).map(|(u, s)| u + s)
}

/// utime and stime, in ticks, from a `stat` file's text.
fn parse_user_system(text: &str) -> Option<(u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime, stime))
}

/// CPU time one process or thread spent, in user space and in the kernel: what one
/// server costs per request, apart from the load generator and the other servers that
/// share the cores with it.
#[derive(Debug, Clone)]
pub struct CpuClock {
    stat: std::path::PathBuf,
}

/// CPU seconds read off a [`CpuClock`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    pub user_s: f64,
    pub system_s: f64,
}

impl CpuTime {
    /// What was spent from `earlier` to `self`.
    pub fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            system_s: (self.system_s - earlier.system_s).max(0.0),
        }
    }
}

impl std::ops::Add for CpuTime {
    type Output = CpuTime;

    fn add(self, other: CpuTime) -> CpuTime {
        CpuTime {
            user_s: self.user_s + other.user_s,
            system_s: self.system_s + other.system_s,
        }
    }
}

impl CpuClock {
    /// Another process, by pid.
    pub fn process(pid: u32) -> Self {
        Self {
            stat: format!("/proc/{pid}/stat").into(),
        }
    }

    /// A thread of this process, by its kernel thread id.
    pub fn thread(tid: u32) -> Self {
        Self {
            stat: format!("/proc/self/task/{tid}/stat").into(),
        }
    }

    /// The calling thread's kernel id, where `/proc` says it.
    pub fn current_thread_id() -> Option<u32> {
        let link = std::fs::read_link("/proc/thread-self").ok()?;
        link.file_name()?.to_str()?.parse().ok()
    }

    /// Its CPU time so far; `None` where `/proc` is not readable.
    pub fn read(&self) -> Option<CpuTime> {
        let text = std::fs::read_to_string(&self.stat).ok()?;
        let (u, s) = parse_user_system(&text)?;
        Some(CpuTime {
            user_s: u as f64 / USER_HZ,
            system_s: s as f64 / USER_HZ,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_counters() {
        let m = parse_stat("cpu  100 5 50 800 40 1 4 0 0 0").unwrap();
        assert_eq!((m.busy, m.iowait, m.total), (160, 40, 1000));
        assert!(parse_stat("intr 1 2 3").is_none());
        let line = "4242 (idem bench (x)) R 1 2 3 4 5 6 7 8 9 10 250 70 0 0 20 0";
        assert_eq!(parse_self_stat(line), Some(320));
        assert_eq!(parse_user_system(line), Some((250, 70)));
    }

    #[test]
    fn a_busy_thread_is_seen_on_its_own_clock() {
        let Some(tid) = CpuClock::current_thread_id() else {
            eprintln!("SKIP a_busy_thread_is_seen_on_its_own_clock: no /proc/thread-self");
            return;
        };
        let clock = CpuClock::thread(tid);
        let before = clock.read().expect("the thread's stat");
        let until = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let spent = clock.read().unwrap().since(before);
        // Ticks are 10 ms; a loop sharing a loaded machine still gets some of them.
        assert!(spent.user_s + spent.system_s > 0.0, "{spent:?}");
        // Another thread has a clock of its own, which did none of this work.
        let (other, idle_before) = std::thread::spawn(|| {
            let tid = CpuClock::current_thread_id().expect("a thread id");
            (tid, CpuClock::thread(tid).read().expect("its stat"))
        })
        .join()
        .unwrap();
        assert_ne!(other, tid);
        // A new thread has run for microseconds: at most one 10 ms tick, if one fell then.
        assert!(
            idle_before.user_s + idle_before.system_s <= 0.01,
            "{idle_before:?}"
        );
    }

    #[test]
    fn verdicts_name_the_limit() {
        assert!(verdict(0.95, 0.0, 1.9, 2, "commits").starts_with("cpu (95% of 2 cores"));
        assert!(verdict(0.95, 0.0, 0.4, 2, "commits").contains("other processes"));
        assert!(verdict(0.5, 0.3, 0.5, 2, "commits").starts_with("disk (30%"));
        assert_eq!(
            verdict(0.5, 0.0, 0.5, 2, "commits"),
            "commits (cpu 50% busy)"
        );
        assert!(verdict(f64::NAN, f64::NAN, f64::NAN, 2, "commits").starts_with("unknown"));
    }

    #[test]
    fn a_busy_loop_is_seen_in_this_process() {
        let meter = Meter::start();
        let until = Instant::now() + std::time::Duration::from_millis(500);
        let mut x = 0u64;
        while Instant::now() < until {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let s = meter.stop("commits");
        // An idle process reads about 0; a loop sharing two cores with a loaded
        // machine (CI builds, other tests) may get well under one.
        assert!(s.process_cores > 0.1, "{s:?}");
        assert!(s.machine_cpu_busy > 0.0, "{s:?}");
    }
}
