//! The worker's clock on its hot path: the cycle counter, calibrated once
//! against the system clock at the worker's start. A read of the system
//! clock costs ~140 ns on the GPU machine (clocksource tsc, yet a vDSO call
//! and a conversion), and the worker read it six or seven times a request
//! (its pass's marks, the query's submit and finish for the transport
//! time, the answer's timestamp, the wake-up's span): about a fifth of a
//! request's ~3.7 us at 64 clients. A cycle-counter read costs ~10 ns.
//!
//! Timestamps (PostgreSQL's TimestampTz, which the backends compare with
//! their own clock) are the system clock's at the last re-basing plus the
//! ticks since, re-based every [`REBASE`]: off by the counter's drift over
//! that span at most, well under a microsecond.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pgrx::pg_sys;

/// How long a timestamp base is used before the system clock is read again.
const REBASE: Duration = Duration::from_millis(100);

/// Nanoseconds a tick, measured at the worker's start ([`calibrate`]).
static NS_PER_TICK: OnceLock<f64> = OnceLock::new();

/// Measures the counter against the system clock (10 ms): at the worker's
/// start, before it serves (a later first use measures then).
pub fn calibrate() -> f64 {
    *NS_PER_TICK.get_or_init(|| {
        let (t0, c0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(10));
        let (ns, c) = (t0.elapsed().as_nanos() as f64, ticks().wrapping_sub(c0));
        if c > 0 {
            ns / c as f64
        } else {
            1.0
        }
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

/// A point in time on the cycle counter (the worker's thread: the counter
/// of the core it runs on; the counters of a machine's cores agree on the
/// machines PostgreSQL runs on, constant and invariant TSC).
#[derive(Clone, Copy, Debug)]
pub struct Tick(u64);

impl Tick {
    pub fn now() -> Tick {
        Tick(ticks())
    }

    /// Nanoseconds from `self` to `later` (0 if `later` is earlier).
    pub fn ns_to(self, later: Tick) -> u64 {
        let d = later.0.saturating_sub(self.0);
        (d as f64 * calibrate()) as u64
    }

    /// Nanoseconds since `self`.
    pub fn ns(self) -> u64 {
        self.ns_to(Tick::now())
    }

    pub fn elapsed(self) -> Duration {
        Duration::from_nanos(self.ns())
    }
}

thread_local! {
    /// (system clock as a TimestampTz, the tick it was read at)
    static BASE: Cell<Option<(i64, Tick)>> = const { Cell::new(None) };
}

/// Now as PostgreSQL's TimestampTz (microseconds since 2000-01-01), from
/// the cycle counter. The worker's main thread only (the re-basing calls
/// PostgreSQL).
pub fn timestamp() -> i64 {
    let now = Tick::now();
    let rebase_ns = REBASE.as_nanos() as u64;
    BASE.with(|b| match b.get().map(|(ts, at)| (ts, at.ns_to(now))) {
        Some((ts, ns)) if ns < rebase_ns => ts + (ns / 1000) as i64,
        _ => {
            // SAFETY: reads the clock; any process may.
            let ts = unsafe { pg_sys::GetCurrentTimestamp() };
            b.set(Some((ts, Tick::now())));
            ts
        }
    })
}
