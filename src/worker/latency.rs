//! Where a worker-served scan's time goes, as percentiles: lock-free
//! histograms in shared memory of microseconds, eight buckets an octave
//! (each about 9% wide), for each step of the path: waiting to be taken,
//! the search, the backend waking to the answer, its re-read of the
//! answered nodes, and the whole round trip; and of the search on the GPU,
//! the kernel's own clock: the first CTA taking the query to the last one's
//! hits written, its start (the scan, or the entry point and seeds), its steps, and the rest
//! of the search (the request's copy and slot word, the kernel's wake-up,
//! its fences and finish word, the worker seeing it).

use std::sync::atomic::{AtomicU64, Ordering};

use gpu_graph_gpu::search::KernelTimes;
use serde::Serialize;

/// Bucket 0 is 0 µs; bucket b ≥ 1 holds [2^((b-1)/8), 2^(b/8)) µs; the last
/// also holds everything longer (2^19.9 µs, about 0.9 s).
const BUCKETS: usize = 160;

/// A histogram on cache lines of its own (PostgreSQL's 128 bytes: two
/// lines, for the adjacent-line prefetch): with 161 words, histograms side
/// by side shared a line, the worker's `search` sum with the first buckets
/// of `wake`, which every backend that polled its answer increments.
#[repr(C, align(128))]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    /// the exact sum of what was recorded (µs), for the mean
    sum: AtomicU64,
}

/// Shards of the histograms and counters that every backend writes at
/// every scan: with one copy, 64 backends on 16 cores incremented the same
/// few words (the round trip's sum, the bucket of an answer seen while
/// polling) hundreds of thousands of times a second, each increment
/// waiting for the line to come from another core.
pub const SHARDS: usize = 16;

/// This process's shard: its PGPROC number's remainder.
pub fn shard() -> usize {
    static SHARD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);
    let s = SHARD.load(Ordering::Relaxed);
    if s != usize::MAX {
        return s;
    }
    // SAFETY: MyProc is this process's PGPROC (or null before it has one);
    // reading its number calls nothing.
    let procno = unsafe { pgrx::pg_sys::MyProc.as_ref().map_or(0, |p| p.pgprocno.max(0) as usize) };
    let s = procno % SHARDS;
    SHARD.store(s, Ordering::Relaxed);
    s
}

/// A histogram that backends record into, one shard each ([`shard`]).
#[repr(C)]
pub struct BackendHistogram {
    shards: [Histogram; SHARDS],
}

impl BackendHistogram {
    pub const fn new() -> BackendHistogram {
        BackendHistogram { shards: [const { Histogram::new() }; SHARDS] }
    }

    pub fn record(&self, us: i64) {
        self.record_in(shard(), us);
    }

    fn record_in(&self, shard: usize, us: i64) {
        self.shards[shard % SHARDS].record(us);
    }

    pub fn reset(&self) {
        self.shards.iter().for_each(Histogram::reset);
    }

    pub fn sum_count(&self) -> (u64, u64) {
        self.shards.iter().map(Histogram::sum_count).fold((0, 0), |(s, n), (a, b)| (s + a, n + b))
    }

    pub fn percentiles(&self) -> Option<Percentiles> {
        let mut counts = vec![0u64; BUCKETS];
        for h in &self.shards {
            for (c, b) in counts.iter_mut().zip(&h.counts) {
                *c += b.load(Ordering::Relaxed);
            }
        }
        percentiles_of(&counts)
    }
}

impl Histogram {
    pub const fn new() -> Histogram {
        Histogram { counts: [const { AtomicU64::new(0) }; BUCKETS], sum: AtomicU64::new(0) }
    }

    pub fn record(&self, us: i64) {
        let us = us.max(0) as u64;
        self.counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(us, Ordering::Relaxed);
    }

    /// Empty again. Not atomic as a whole: a value recorded meanwhile may
    /// keep its count and lose its sum, or the reverse (as
    /// pg_stat_reset's counters, an approximation while traffic runs).
    pub fn reset(&self) {
        self.counts.iter().for_each(|c| c.store(0, Ordering::Relaxed));
        self.sum.store(0, Ordering::Relaxed);
    }

    /// The exact sum of what was recorded and how many, for the mean.
    pub fn sum_count(&self) -> (u64, u64) {
        (self.sum.load(Ordering::Relaxed), self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum())
    }

    /// The count and the 50th, 90th and 99th percentiles (each a bucket's
    /// upper bound); None when empty.
    pub fn percentiles(&self) -> Option<Percentiles> {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        percentiles_of(&counts)
    }
}

fn percentiles_of(counts: &[u64]) -> Option<Percentiles> {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return None;
    }
    let at = |p: f64| {
        let want = ((p * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let b = counts.iter().position(|&c| {
            seen += c;
            seen >= want
        });
        upper(b.unwrap_or(BUCKETS - 1))
    };
    Some(Percentiles { count: n, p50: at(0.50), p90: at(0.90), p99: at(0.99) })
}

fn bucket(us: u64) -> usize {
    if us == 0 {
        return 0;
    }
    ((8.0 * (us as f64).log2()).floor() as usize + 1).min(BUCKETS - 1)
}

/// A bucket's upper bound in µs, to one decimal.
fn upper(b: usize) -> f64 {
    if b == 0 {
        return 0.0;
    }
    (2f64.powf(b as f64 / 8.0) * 10.0).round() / 10.0
}

#[derive(Serialize, Debug, PartialEq)]
pub struct Percentiles {
    count: u64,
    p50: f64,
    p90: f64,
    p99: f64,
}

/// The steps of a worker-served scan.
#[repr(C)]
pub struct Latencies {
    /// submitted → taken by the worker
    pub queue: Histogram,
    /// taken → answered (answers with results)
    pub search: Histogram,
    /// answered → the backend reading the answer (its latch wake-up)
    pub wake: BackendHistogram,
    /// the backend taking the answer's rows: from the reply, or re-read
    /// from the pages where the copy's distances are not theirs
    pub verify: BackendHistogram,
    /// submitted → answer read, as the backend sees it
    pub roundtrip: BackendHistogram,
    /// GPU: the first CTA taking the query → the last one's hits written
    pub kernel: Histogram,
    /// GPU: a CTA taking the query → its start absorbed (the slowest CTA)
    pub kernel_start: Histogram,
    /// GPU: steps of the search loop (the most of any CTA; a count, not µs)
    pub kernel_steps: Histogram,
    /// GPU: the dispatcher seeing the request's ring entry → the first CTA
    /// taking the query (the request's copy from host memory, the slot
    /// word, the CTA's poll)
    pub kernel_dispatch: Histogram,
    /// GPU: the worker's submit → its seeing the answer, less `kernel`
    pub transport: Histogram,
}

impl Latencies {
    pub const fn new() -> Latencies {
        Latencies {
            queue: Histogram::new(),
            search: Histogram::new(),
            wake: BackendHistogram::new(),
            verify: BackendHistogram::new(),
            roundtrip: BackendHistogram::new(),
            kernel: Histogram::new(),
            kernel_start: Histogram::new(),
            kernel_steps: Histogram::new(),
            kernel_dispatch: Histogram::new(),
            transport: Histogram::new(),
        }
    }

    /// Every step's histogram empty again (gpu_graph_worker_latency_reset).
    pub fn reset(&self) {
        let own = [
            &self.queue,
            &self.search,
            &self.kernel,
            &self.kernel_start,
            &self.kernel_steps,
            &self.kernel_dispatch,
            &self.transport,
        ];
        for h in own {
            h.reset();
        }
        for h in [&self.wake, &self.verify, &self.roundtrip] {
            h.reset();
        }
    }

    /// The kernel's clock of one search (`kernel`, `kernel_start`,
    /// `kernel_steps`, `kernel_dispatch`), whoever read its answer: the worker or the scan;
    /// its span in µs.
    pub fn record_kernel(&self, t: &KernelTimes) -> i64 {
        let us = |ns: u32| (ns as i64 + 500) / 1000;
        self.kernel.record(us(t.span_ns));
        self.kernel_start.record(us(t.start_ns));
        self.kernel_steps.record(t.steps as i64);
        self.kernel_dispatch.record(us(t.dispatch_ns));
        us(t.span_ns)
    }
}

/// The percentiles of each step, for gpu_graph_worker_stats().
#[derive(Serialize)]
pub struct LatencyJson {
    queue: Option<Percentiles>,
    search: Option<Percentiles>,
    wake: Option<Percentiles>,
    verify: Option<Percentiles>,
    roundtrip: Option<Percentiles>,
    kernel: Option<Percentiles>,
    kernel_start: Option<Percentiles>,
    kernel_steps: Option<Percentiles>,
    kernel_dispatch: Option<Percentiles>,
    transport: Option<Percentiles>,
}

impl LatencyJson {
    pub fn of(l: &Latencies) -> LatencyJson {
        LatencyJson {
            queue: l.queue.percentiles(),
            search: l.search.percentiles(),
            wake: l.wake.percentiles(),
            verify: l.verify.percentiles(),
            roundtrip: l.roundtrip.percentiles(),
            kernel: l.kernel.percentiles(),
            kernel_start: l.kernel_start.percentiles(),
            kernel_steps: l.kernel_steps.percentiles(),
            kernel_dispatch: l.kernel_dispatch.percentiles(),
            transport: l.transport.percentiles(),
        }
    }
}

// each histogram on lines of its own, whatever its neighbours
const _: () = assert!(std::mem::size_of::<Histogram>().is_multiple_of(128));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_sum_to_one_histogram() {
        let (one, sharded) = (Histogram::new(), BackendHistogram::new());
        assert_eq!(sharded.percentiles(), None);
        // the same 1,000 times, spread over every shard
        for i in 0..1000i64 {
            let us = (i * 37) % 700;
            one.record(us);
            sharded.record_in(i as usize, us);
        }
        assert_eq!(sharded.percentiles(), one.percentiles());
        assert_eq!(sharded.sum_count(), one.sum_count());
        assert_eq!(sharded.sum_count().1, 1000);
    }

    #[test]
    fn a_reset_empties_every_step() {
        let l = Latencies::new();
        for i in 0..100i64 {
            l.queue.record(i);
            l.transport.record(i);
            l.roundtrip.record_in(i as usize, i);
        }
        l.record_kernel(&KernelTimes { span_ns: 40_000, steps: 12, ..KernelTimes::default() });
        assert_eq!(l.roundtrip.sum_count(), (4950, 100));
        l.reset();
        let all = [&l.queue, &l.search, &l.kernel, &l.kernel_start, &l.kernel_steps, &l.kernel_dispatch, &l.transport];
        for h in all {
            assert_eq!((h.sum_count(), h.percentiles()), ((0, 0), None));
        }
        for h in [&l.wake, &l.verify, &l.roundtrip] {
            assert_eq!((h.sum_count(), h.percentiles()), ((0, 0), None));
        }
        // and counts again from nothing (record_in: record's shard reads
        // PostgreSQL's MyProc, not linked into a unit test)
        l.roundtrip.record_in(3, 7);
        assert_eq!(l.roundtrip.sum_count(), (7, 1));
    }

    #[test]
    fn buckets_are_an_eighth_of_an_octave() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        // 100 µs lies in the bucket whose upper bound is the first power of
        // 2^(1/8) above it
        let b = bucket(100);
        assert!(upper(b) > 100.0 && upper(b - 1) <= 100.0, "{} {}", upper(b - 1), upper(b));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_of_a_known_spread() {
        let h = Histogram::new();
        assert_eq!(h.percentiles(), None);
        // 90 at 10 µs, 9 at 100 µs, 1 at 1000 µs
        (0..90).for_each(|_| h.record(10));
        (0..9).for_each(|_| h.record(100));
        h.record(1000);
        let p = h.percentiles().unwrap();
        assert_eq!(p.count, 100);
        assert_eq!(p.p50, upper(bucket(10)));
        assert_eq!(p.p90, upper(bucket(10)));
        assert_eq!(p.p99, upper(bucket(100)));
        assert!(p.p99 >= 100.0 && p.p99 < 110.0, "{p:?}");
        // a negative time (clocks of two processes) counts as 0
        h.record(-5);
        assert_eq!(h.percentiles().unwrap().count, 101);
        // the sum is exact, not the buckets'
        assert_eq!(h.sum_count(), (90 * 10 + 9 * 100 + 1000, 101));
    }
}
