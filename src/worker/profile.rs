//! Where the worker's thread spends its time a request, by part, when the
//! server runs with GPU_GRAPH_WORKER_PROFILE=1 in its environment (for
//! benchmarks: each part costs two reads of the cycle counter, ~15 ns, at
//! every look at a search still on the device as well). The GPU machine has
//! no profiler; the clock (~140 ns a read there) is too dear for it
//! (worker::clock).
//!
//! Parts: scanning the ring's slots for requests, patching the copies the
//! requests taken need (those a pass with requests makes), starting each
//! request (its copy's lookup and the query sent), looking at searches not
//! finished, collecting finished ones (the CTAs' lists read from mapped
//! memory and merged), and writing the reply. (Patches made in idle
//! passes, and waking the backends, are counted elsewhere.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::clock::Tick;

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

/// Whether the worker is profiled (GPU_GRAPH_WORKER_PROFILE=1).
fn profiled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPU_GRAPH_WORKER_PROFILE").ok().as_deref() == Some("1"))
}

/// A span being timed: None when not profiling.
#[derive(Clone, Copy)]
pub struct Mark(Option<Tick>);

impl Mark {
    pub fn now() -> Mark {
        Mark(profiled().then(Tick::now))
    }

    /// Nanoseconds since the mark (0 when not profiling).
    pub fn ns(self) -> u64 {
        self.0.map_or(0, Tick::ns)
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
