//! What the worker and the scans count, and the SQL that shows it:
//! gpu_graph_worker_stats() and the "search" object of gpu_graph_info().
//!
//! The counters live in shared memory when gpu_graph is preloaded (one set
//! for the cluster); otherwise each backend counts its own scans.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use std::collections::BTreeMap;

use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};
use serde::Serialize;

use super::latency::{shard, Latencies, LatencyJson, SHARDS};
use super::outcome::Outcome;
use super::profile::{Profile, ProfileJson};
use super::ring::State;
use super::shmem::{shared, Shared, DEVICE_CPU, DEVICE_GPU};

/// Per-scan counts of a shard of backends, on cache lines of their own
/// (latency::SHARDS says why).
#[repr(C, align(128))]
struct OutcomeCounts([AtomicU64; Outcome::ALL.len()]);

/// Puts the next field at the start of a cache line (PostgreSQL's 128
/// bytes): the worker's counters apart from those the backends write.
#[repr(C, align(128))]
struct LineBreak;

#[repr(C)]
pub struct Counters {
    /// scans that asked the worker, by [`Outcome`]: answered, or why not;
    /// a shard of backends each (latency::shard)
    outcomes: [OutcomeCounts; SHARDS],
    /// scans whose first round was searched on the CPU (not asking the
    /// worker, or after a fallback)
    pub scans_cpu: AtomicU64,
    /// worker-served scans that went on to search on the CPU (the executor
    /// wanted more rows than the answer had)
    pub cpu_after_worker: AtomicU64,
    /// worker-served scans whose answer was read again from the pages (a
    /// copy whose distances are not the pages': worker::client)
    pub scans_reread: AtomicU64,
    /// inserts whose neighbour search the worker answered, and those that
    /// searched on the CPU (not asking it, or no answer)
    pub inserts_worker: AtomicU64,
    pub inserts_cpu: AtomicU64,
    _worker_side: LineBreak,
    /// worker side: requests taken, answers given (any status), answers
    /// with results (their times: `latency`)
    pub taken: AtomicU64,
    pub answered: AtomicU64,
    pub searched: AtomicU64,
    /// of the answers, those the scans read where the GPU wrote them
    /// (worker::own_answer)
    pub answers_read: AtomicU64,
    /// the worker's loop passes that took, answered, patched or loaded
    /// something: their time (ns). Against the wall clock, how busy its one
    /// thread is (its spinning while searches are on the device, and its
    /// sleep, left out)
    pub work_ns: AtomicU64,
    /// of that: taking requests and starting their searches (patches
    /// included), polling the device and answering, and of the answers
    /// the wake-ups (SetLatch: a signal to a backend asleep on its latch)
    pub take_ns: AtomicU64,
    pub progress_ns: AtomicU64,
    pub wake_ns: AtomicU64,
    /// the worker's busy passes, and its looks at searches on the device
    /// not finished yet (what its polling costs a request answered)
    pub passes: AtomicU64,
    pub polls_pending: AtomicU64,
    /// the worker's thread by part (worker::profile), when profiled
    pub profile: Profile,
    /// copies made and dropped
    pub loads: AtomicU64,
    pub load_us: AtomicU64,
    pub evictions: AtomicU64,
    /// copies brought up to date from the change log, the pages re-read
    /// for it, and the times the log overflowed (copies then refreshed whole)
    pub patches: AtomicU64,
    pub patched_pages: AtomicU64,
    pub log_overflows: AtomicU64,
    /// rows (vector tuples) patched into copies: as the change log carried
    /// them, and read from their pages
    pub patched_rows_from_log: AtomicU64,
    pub patched_rows_from_pages: AtomicU64,
    /// patches that read no page of their index (the log carried every
    /// change, the meta page's included)
    pub patches_from_log: AtomicU64,
    /// copies brought up to date in place after an overflow (pages whose
    /// LSN moved read again), and the pages read
    pub resyncs: AtomicU64,
    pub resynced_pages: AtomicU64,
    /// the worker's time bringing copies up to date (reading the pages and
    /// copying them to the device): the part of its one thread writes take
    pub patch_us: AtomicU64,
    /// of which reading the pages (the rest: copying to the device)
    pub patch_read_us: AtomicU64,
    /// reads of the change log and the patches after them that took over
    /// 10 ms (the requests taken wait for them)
    pub slow_syncs: AtomicU64,
    /// batches (gpu_graph_search_batch, a segment of queries each) that
    /// asked the worker, those searched on the CPU instead by [`Outcome`]
    /// (why not answered), the queries the worker answered, and its time
    /// on them (take to answer)
    pub batches: AtomicU64,
    batch_fallbacks: [AtomicU64; Outcome::ALL.len()],
    pub batch_queries: AtomicU64,
    /// of those, the queries whose answers the backend read again from the
    /// pages (a copy whose distances are not the pages': batch_area)
    pub batch_queries_reread: AtomicU64,
    pub batch_us: AtomicU64,
    /// of which: attaching the segment, preparing and sending the queries;
    /// the device's search (sent to answers read back); writing the answers
    pub batch_start_us: AtomicU64,
    pub batch_device_us: AtomicU64,
    pub batch_write_us: AtomicU64,
    /// each step of a worker-served scan, as histograms (and their means)
    pub latency: Latencies,
}

// the worker's counters start a line of their own
const _: () = assert!(std::mem::offset_of!(Counters, taken).is_multiple_of(128));

impl Counters {
    /// Scans that asked the worker with this outcome, every shard's.
    fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes.iter().map(|s| get(&s.0[o.index()])).sum()
    }

    const fn new() -> Counters {
        Counters {
            outcomes: [const { OutcomeCounts([const { AtomicU64::new(0) }; Outcome::ALL.len()]) }; SHARDS],
            scans_cpu: AtomicU64::new(0),
            cpu_after_worker: AtomicU64::new(0),
            scans_reread: AtomicU64::new(0),
            inserts_worker: AtomicU64::new(0),
            inserts_cpu: AtomicU64::new(0),
            _worker_side: LineBreak,
            taken: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            searched: AtomicU64::new(0),
            answers_read: AtomicU64::new(0),
            work_ns: AtomicU64::new(0),
            take_ns: AtomicU64::new(0),
            progress_ns: AtomicU64::new(0),
            wake_ns: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            polls_pending: AtomicU64::new(0),
            profile: Profile::new(),
            loads: AtomicU64::new(0),
            load_us: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            patches: AtomicU64::new(0),
            patched_pages: AtomicU64::new(0),
            log_overflows: AtomicU64::new(0),
            patched_rows_from_log: AtomicU64::new(0),
            patched_rows_from_pages: AtomicU64::new(0),
            patches_from_log: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            resynced_pages: AtomicU64::new(0),
            patch_us: AtomicU64::new(0),
            patch_read_us: AtomicU64::new(0),
            slow_syncs: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batch_fallbacks: [const { AtomicU64::new(0) }; Outcome::ALL.len()],
            batch_queries: AtomicU64::new(0),
            batch_queries_reread: AtomicU64::new(0),
            batch_us: AtomicU64::new(0),
            batch_start_us: AtomicU64::new(0),
            batch_device_us: AtomicU64::new(0),
            batch_write_us: AtomicU64::new(0),
            latency: Latencies::new(),
        }
    }
}

static LOCAL: Counters = Counters::new();

/// The cluster's counters, or this backend's when gpu_graph is not preloaded.
pub fn counters() -> &'static Counters {
    shared().map_or(&LOCAL, |s| &s.counters)
}

pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Counts the outcome of a scan that asked the worker; a fallback is also a
/// scan searched on the CPU.
pub fn record(outcome: Outcome) {
    let c = counters();
    add(&c.outcomes[shard()].0[outcome.index()], 1);
    if outcome != Outcome::Answered {
        add(&c.scans_cpu, 1);
    }
}

/// Counts a batch segment that the worker did not answer (searched on the
/// CPU instead), by why.
pub fn record_batch_fallback(outcome: Outcome) {
    add(&counters().batch_fallbacks[outcome.index()], 1);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// One resident copy, as the worker publishes it.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct ResidentEntry {
    pub spc_node: u32,
    pub db_node: u32,
    pub rel_node: u32,
    pub nodes: u32,
    pub generation: u64,
    pub bytes: u64,
    pub loaded_at: i64,
}

pub const SHOWN_RESIDENTS: usize = 64;

/// The worker's resident copies, for display. The worker replaces the whole
/// table after each load or eviction; a spin lock (held for a copy of at most
/// 64 entries, no PostgreSQL call inside) keeps readers from seeing half of it.
#[repr(C)]
pub struct ResidentTable {
    lock: AtomicBool,
    n: AtomicU32,
    entries: UnsafeCell<[ResidentEntry; SHOWN_RESIDENTS]>,
}

// SAFETY: the cell is read and written only under `lock` (see `locked`).
unsafe impl Sync for ResidentTable {}

impl ResidentTable {
    fn locked<T>(&self, f: impl FnOnce(&mut [ResidentEntry; SHOWN_RESIDENTS], &AtomicU32) -> T) -> T {
        while self.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the spin lock is held: no other reference to the entries
        // exists until it is released below.
        let out = f(unsafe { &mut *self.entries.get() }, &self.n);
        self.lock.store(false, Ordering::Release);
        out
    }

    pub fn publish(&self, list: &[ResidentEntry]) {
        self.locked(|e, n| {
            let m = list.len().min(SHOWN_RESIDENTS);
            e[..m].copy_from_slice(&list[..m]);
            n.store(m as u32, Ordering::Relaxed);
        })
    }

    pub fn read(&self) -> Vec<ResidentEntry> {
        self.locked(|e, n| e[..n.load(Ordering::Relaxed) as usize].to_vec())
    }
}

/// A resident copy in the jsonb of gpu_graph_worker_stats() and gpu_graph_info().
#[derive(Serialize)]
pub struct ResidentJson {
    tablespace: u32,
    database: u32,
    relfilenode: u32,
    generation: u64,
    nodes: u32,
    bytes: u64,
    /// to a tenth of a second
    loaded_seconds_ago: f64,
}

impl ResidentJson {
    fn of(e: &ResidentEntry) -> ResidentJson {
        // SAFETY: GetCurrentTimestamp reads the clock; any backend may call it.
        let age_us = unsafe { pg_sys::GetCurrentTimestamp() } - e.loaded_at;
        ResidentJson {
            tablespace: e.spc_node,
            database: e.db_node,
            relfilenode: e.rel_node,
            generation: e.generation,
            nodes: e.nodes,
            bytes: e.bytes,
            loaded_seconds_ago: (age_us.max(0) / 100_000) as f64 / 10.0,
        }
    }
}

/// A histogram's exact mean, as [`mean`].
fn mean_of((sum, n): (u64, u64)) -> Option<f64> {
    mean(sum, n)
}

/// `sum / n` to one decimal; null when `n` is 0.
fn mean(sum: u64, n: u64) -> Option<f64> {
    (n != 0).then(|| (sum as f64 / n as f64 * 10.0).round() / 10.0)
}

/// "running", "absent" (registered, not serving now), "not started"
/// (preloaded, no worker registered) or "not preloaded".
fn worker_state() -> &'static str {
    match shared() {
        None => "not preloaded",
        Some(s) if !s.configured => "not started",
        Some(s) if s.worker().is_some() => "running",
        Some(_) => "absent",
    }
}

/// The jsonb gpu_graph_worker_stats() returns; absent values are null.
#[derive(Serialize)]
struct WorkerStats {
    /// "cluster" (shared counters) or "backend" (this backend's own)
    scope: &'static str,
    worker: Worker,
    scans: Scans,
    /// inserts' neighbour searches: answered by the worker, searched on the CPU
    inserts: Inserts,
    /// scans that asked the worker and searched on the CPU, by [`Outcome`]
    fallbacks: BTreeMap<&'static str, u64>,
    requests: Requests,
    residency: Residency,
    batches: Batches,
    /// microseconds of each step of a worker-served scan: count, p50, p90, p99
    latency_us: LatencyJson,
}

#[derive(Serialize)]
struct Worker {
    state: &'static str,
    /// only when gpu_graph is preloaded
    #[serde(flatten)]
    ring: Option<Ring>,
}

#[derive(Serialize)]
struct Ring {
    pid: Option<i32>,
    device: Option<&'static str>,
    starts: u64,
    /// the core the worker keeps to itself (gpu_graph.worker_core)
    core: Option<i32>,
    slots: u32,
    slots_in_use: usize,
}

#[derive(Serialize)]
struct Scans {
    worker: u64,
    cpu: u64,
    cpu_after_worker: u64,
    reread: u64,
}

#[derive(Serialize)]
struct Inserts {
    worker: u64,
    cpu: u64,
}

#[derive(Serialize)]
struct Requests {
    taken: u64,
    answered: u64,
    searched: u64,
    /// answers the scans read themselves where the GPU wrote them
    read_by_scans: u64,
    mean_queue_us: Option<f64>,
    mean_search_us: Option<f64>,
    mean_roundtrip_us: Option<f64>,
    /// the worker's thread busy taking, answering, patching and loading
    work_ms: f64,
    /// of which taking and starting requests (patches included), polling
    /// and answering, and waking the backends answered
    take_ms: f64,
    progress_ms: f64,
    wake_ms: f64,
    /// busy passes of the worker's loop, and its looks at searches still
    /// on the device
    passes: u64,
    polls_pending: u64,
    /// with GPU_GRAPH_WORKER_PROFILE=1 (worker::profile)
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<ProfileJson>,
}

#[derive(Serialize)]
struct Batches {
    /// segments of gpu_graph_search_batch's queries that asked the worker,
    /// those searched on the CPU instead, and why (as for scans)
    asked: u64,
    cpu: u64,
    fallbacks: BTreeMap<&'static str, u64>,
    /// queries the worker answered (of which read again from the pages),
    /// its time on them and queries/s
    queries: u64,
    reread: u64,
    worker_ms: f64,
    worker_queries_per_s: Option<f64>,
    /// of the worker's time (GPU batches): sending, the device's search
    /// (with its copies), writing the answers
    start_ms: f64,
    device_ms: f64,
    write_ms: f64,
}

#[derive(Serialize)]
struct Residency {
    loads: u64,
    mean_load_ms: Option<f64>,
    evictions: u64,
    /// copies brought up to date from the change log (pages re-read), and
    /// the log's overflows (copies refreshed whole)
    patches: u64,
    patched_pages: u64,
    log_overflows: u64,
    /// rows patched in: as the change log carried them, read from pages
    patched_rows_from_log: u64,
    patched_rows_from_pages: u64,
    /// patches that read no page (the log carried all they needed)
    patches_from_log: u64,
    /// copies read again in place after an overflow, and the pages read
    resyncs: u64,
    resynced_pages: u64,
    /// the worker's time spent on them, in all and per patch
    patch_ms: f64,
    patch_read_ms: f64,
    mean_patch_us: Option<f64>,
    slow_syncs: u64,
    indexes: Vec<ResidentJson>,
}

fn ring(s: &Shared) -> Ring {
    Ring {
        pid: s.worker(),
        device: match s.worker_device.load(Ordering::Relaxed) {
            DEVICE_CPU => Some("cpu"),
            DEVICE_GPU => Some("gpu"),
            _ => None,
        },
        starts: get(&s.worker_starts),
        core: Some(s.worker_core()).filter(|&c| c >= 0),
        slots: s.nslots,
        slots_in_use: s.slots().iter().filter(|slot| slot.state().1 != State::Free).count(),
    }
}

/// Starts the latency breakdown over: a measurement's percentiles without
/// the traffic before it (the counters go on, to be taken as differences).
#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_worker_latency_reset() RETURNS void
    AS 'MODULE_PATHNAME', 'gpu_graph_worker_latency_reset_wrapper' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION gpu_graph_worker_latency_reset() FROM PUBLIC;
COMMENT ON FUNCTION gpu_graph_worker_latency_reset() IS
    'gpu_graph search worker: empties the latency_us histograms of gpu_graph_worker_stats() (and the requests'' mean_*_us); counters go on';
")]
fn gpu_graph_worker_latency_reset() {
    counters().latency.reset();
}

#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_worker_stats() RETURNS jsonb
    AS 'MODULE_PATHNAME', 'gpu_graph_worker_stats_wrapper' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION gpu_graph_worker_stats() IS
    'gpu_graph search worker: state, scans served by the worker and by the CPU, CPU fallbacks by reason, timings, resident index copies';
")]
fn gpu_graph_worker_stats() -> JsonB {
    let c = counters();
    let (scans_worker, taken, loads) = (c.outcome(Outcome::Answered), get(&c.taken), get(&c.loads));
    let stats = WorkerStats {
        scope: if shared().is_some() { "cluster" } else { "backend" },
        worker: Worker { state: worker_state(), ring: shared().map(ring) },
        scans: Scans {
            worker: scans_worker,
            cpu: get(&c.scans_cpu),
            cpu_after_worker: get(&c.cpu_after_worker),
            reread: get(&c.scans_reread),
        },
        inserts: Inserts { worker: get(&c.inserts_worker), cpu: get(&c.inserts_cpu) },
        fallbacks: Outcome::ALL[1..].iter().map(|&o| (o.name(), c.outcome(o))).collect(),
        requests: Requests {
            taken,
            answered: get(&c.answered),
            searched: get(&c.searched),
            read_by_scans: get(&c.answers_read),
            mean_queue_us: mean_of(c.latency.queue.sum_count()),
            mean_search_us: mean_of(c.latency.search.sum_count()),
            mean_roundtrip_us: mean_of(c.latency.roundtrip.sum_count()),
            work_ms: get(&c.work_ns) as f64 / 1e6,
            take_ms: get(&c.take_ns) as f64 / 1e6,
            progress_ms: get(&c.progress_ns) as f64 / 1e6,
            wake_ms: get(&c.wake_ns) as f64 / 1e6,
            passes: get(&c.passes),
            polls_pending: get(&c.polls_pending),
            profile: c.profile.json(),
        },
        residency: Residency {
            loads,
            mean_load_ms: mean(get(&c.load_us), loads * 1000),
            evictions: get(&c.evictions),
            patches: get(&c.patches),
            patched_pages: get(&c.patched_pages),
            log_overflows: get(&c.log_overflows),
            patched_rows_from_log: get(&c.patched_rows_from_log),
            patched_rows_from_pages: get(&c.patched_rows_from_pages),
            patches_from_log: get(&c.patches_from_log),
            resyncs: get(&c.resyncs),
            resynced_pages: get(&c.resynced_pages),
            patch_ms: get(&c.patch_us) as f64 / 1000.0,
            patch_read_ms: get(&c.patch_read_us) as f64 / 1000.0,
            mean_patch_us: mean(get(&c.patch_us), get(&c.patches)),
            slow_syncs: get(&c.slow_syncs),
            indexes: shared()
                .map(|s| s.residents.read().iter().filter(|e| visible(e.db_node)).map(ResidentJson::of).collect())
                .unwrap_or_default(),
        },
        batches: Batches {
            asked: get(&c.batches),
            cpu: c.batch_fallbacks.iter().map(get).sum(),
            fallbacks: Outcome::ALL[1..].iter().map(|&o| (o.name(), get(&c.batch_fallbacks[o.index()]))).collect(),
            queries: get(&c.batch_queries),
            reread: get(&c.batch_queries_reread),
            worker_ms: get(&c.batch_us) as f64 / 1000.0,
            worker_queries_per_s: mean(get(&c.batch_queries) * 1_000_000, get(&c.batch_us)),
            start_ms: get(&c.batch_start_us) as f64 / 1000.0,
            device_ms: get(&c.batch_device_us) as f64 / 1000.0,
            write_ms: get(&c.batch_write_us) as f64 / 1000.0,
        },
        latency_us: LatencyJson::of(&c.latency),
    };
    JsonB(serde_json::to_value(stats).expect("gpu_graph_worker_stats: string keys only"))
}

/// Whether a resident copy of an index of database `db` is listed for the
/// current role: those of this database, or all with pg_read_all_stats (as
/// pg_stat_activity shows other databases' sessions only to such roles).
/// The counters are the backend's own (PARALLEL RESTRICTED: a parallel
/// worker's would be another's).
fn visible(db: u32) -> bool {
    // SAFETY: plain reads of this backend's globals and a catalog lookup, in
    // a transaction (a SQL function's call).
    unsafe {
        db == pg_sys::MyDatabaseId.to_u32()
            || pg_sys::has_privs_of_role(pg_sys::GetUserId(), pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS))
    }
}

/// The "search" object of gpu_graph_info(index): the worker's state and the
/// index's resident copy (null when there is none).
#[derive(Serialize)]
pub struct SearchInfo {
    worker: &'static str,
    resident: Option<ResidentJson>,
    /// the meta page's generation and node count as the scans the worker
    /// answers read them (worker::meta_mirror); null when it holds none
    meta_mirror: Option<MirrorJson>,
}

#[derive(Serialize)]
struct MirrorJson {
    generation: u64,
    node_count: u32,
}

/// The "search" object of gpu_graph_info(index).
///
/// # Safety
/// `rel` must be an open index relation.
pub unsafe fn index_info(rel: pg_sys::Relation) -> SearchInfo {
    // SAFETY: an open relation (the caller's contract).
    let key = unsafe { super::image::Key::of_relation(rel) };
    let resident = shared().and_then(|s| {
        s.residents.read().into_iter().find(|e| (e.spc_node, e.db_node, e.rel_node) == (key.spc, key.db, key.rel))
    });
    let mirror = shared()
        .and_then(|s| s.meta_mirror.get(key))
        .map(|(generation, node_count)| MirrorJson { generation, node_count });
    SearchInfo { worker: worker_state(), resident: resident.as_ref().map(ResidentJson::of), meta_mirror: mirror }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn absent_values_are_null_and_the_ring_only_when_preloaded() {
        let alone = Worker { state: "not preloaded", ring: None };
        assert_eq!(serde_json::to_value(alone).unwrap(), json!({"state": "not preloaded"}));
        let ring = Ring { pid: None, device: None, starts: 1, core: None, slots: 8, slots_in_use: 0 };
        let absent = Worker { state: "absent", ring: Some(ring) };
        assert_eq!(
            serde_json::to_value(absent).unwrap(),
            json!({"state": "absent", "pid": null, "device": null, "starts": 1, "core": null, "slots": 8, "slots_in_use": 0})
        );
        let info = SearchInfo { worker: "running", resident: None, meta_mirror: None };
        assert_eq!(
            serde_json::to_value(info).unwrap(),
            json!({"worker": "running", "resident": null, "meta_mirror": null})
        );
        assert_eq!(serde_json::to_value(mean(0, 0)).unwrap(), json!(null));
        assert_eq!(serde_json::to_value(mean(10, 4)).unwrap(), json!(2.5));
    }
}
