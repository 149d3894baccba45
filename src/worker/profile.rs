//! Where the worker's thread spends its time a request, by part, when the
//! server runs with GPU_GRAPH_WORKER_PROFILE=1 in its environment (for
//! benchmarks: each part costs two reads of the cycle counter, ~15 ns, at
//! every look at a search still on the device as well). The GPU machine has
//! no profiler, and the cycle counter costs less than the clock.
//!
//! Parts: scanning the ring's slots for requests, patching the copies the
//! requests taken need (those a pass with requests makes), starting each
//! request (its copy's lookup and the query sent), looking at searches not
//! finished, collecting finished ones (the CTAs' lists read from mapped
//! memory and merged), and writing the reply. (Patches made in idle
//! passes, and waking the backends, are counted elsewhere.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Serialize;

#[repr(C)]
pub struct Profile {
    pub scan: AtomicU64,
    pub patch: AtomicU64,
    pub start: AtomicU64,
    pub look: AtomicU64,
    pub collect: AtomicU64,
    pub reply: AtomicU64,
}

impl Profile {
    pub const fn new() -> Profile {
        Profile {
            scan: AtomicU64::new(0),
            patch: AtomicU64::new(0),
            start: AtomicU64::new(0),
            look: AtomicU64::new(0),
            collect: AtomicU64::new(0),
            reply: AtomicU64::new(0),
        }
    }

    /// Milliseconds of each part so far; None when none was profiled.
    pub fn json(&self) -> Option<ProfileJson> {
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        let p = ProfileJson {
            scan_ms: ms(&self.scan),
            patch_ms: ms(&self.patch),
            start_ms: ms(&self.start),
            look_ms: ms(&self.look),
            collect_ms: ms(&self.collect),
            reply_ms: ms(&self.reply),
        };
        (p.scan_ms + p.patch_ms + p.start_ms + p.look_ms + p.collect_ms + p.reply_ms > 0.0).then_some(p)
    }
}

#[derive(Serialize)]
pub struct ProfileJson {
    scan_ms: f64,
    patch_ms: f64,
    start_ms: f64,
    look_ms: f64,
    collect_ms: f64,
    reply_ms: f64,
}

/// Nanoseconds a cycle-counter tick, when profiling (measured once).
static NS_PER_TICK: OnceLock<Option<f64>> = OnceLock::new();

fn ns_per_tick() -> Option<f64> {
    *NS_PER_TICK.get_or_init(|| {
        if std::env::var("GPU_GRAPH_WORKER_PROFILE").ok().as_deref() != Some("1") {
            return None;
        }
        let (t0, c0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(20));
        let (ns, c) = (t0.elapsed().as_nanos() as f64, ticks().wrapping_sub(c0));
        (c > 0).then(|| ns / c as f64)
    })
}

fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC has no preconditions on x86-64.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static T0: OnceLock<Instant> = OnceLock::new();
        T0.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// A span being timed: None when not profiling.
#[derive(Clone, Copy)]
pub struct Mark(Option<u64>);

impl Mark {
    pub fn now() -> Mark {
        Mark(ns_per_tick().map(|_| ticks()))
    }

    /// Nanoseconds since the mark (0 when not profiling).
    pub fn ns(self) -> u64 {
        match (self.0, ns_per_tick()) {
            (Some(t0), Some(ns)) => (ticks().wrapping_sub(t0) as f64 * ns) as u64,
            _ => 0,
        }
    }

    /// Adds the time since the mark to `part`; a new mark.
    pub fn lap(self, part: &AtomicU64) -> Mark {
        if self.0.is_none() {
            return self;
        }
        let ns = self.ns();
        part.fetch_add(ns, Ordering::Relaxed);
        Mark::now()
    }
}
