//! Whether the server can still serve: closed by its owner, or poisoned by a
//! CUDA error or by the kernel exiting on its own. A waiting thread asks the
//! kernel's stream at most once a millisecond.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::launch::{Kernel, KernelState};
use super::server::SearchError;

const CHECK_EVERY_US: u64 = 1000;

/// Polls of unfinished queries between two looks at the clock
/// ([`Health::check_polled`]).
const POLLS_PER_LOOK: u32 = 64;

pub(crate) struct Health {
    closed: AtomicBool,
    poisoned: AtomicBool,
    /// poisoned by a CUDA error (sticky: the context, and after a fault
    /// inside a kernel the whole process, cannot use CUDA any more)
    sticky: AtomicBool,
    reason: Mutex<Option<String>>,
    t0: Instant,
    last_check_us: AtomicU64,
}

impl Health {
    pub fn new() -> Health {
        Health {
            closed: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            sticky: AtomicBool::new(false),
            reason: Mutex::new(None),
            t0: Instant::now(),
            last_check_us: AtomicU64::new(0),
        }
    }

    fn text(&self) -> String {
        self.reason.lock().clone().unwrap_or_else(|| "unknown".into())
    }

    /// Poisons the server with the first reason given; `sticky` when a CUDA
    /// error (not the kernel quitting by itself) is the cause.
    pub fn poison(&self, why: String, sticky: bool) -> SearchError {
        self.reason.lock().get_or_insert(why);
        if sticky {
            self.sticky.store(true, Ordering::Release);
        }
        self.poisoned.store(true, Ordering::Release);
        SearchError::Poisoned(self.text())
    }

    pub fn poisoned(&self) -> Option<String> {
        self.poisoned.load(Ordering::Acquire).then(|| self.text())
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }
    pub fn sticky(&self) -> bool {
        self.sticky.load(Ordering::Acquire)
    }
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
    /// Closes; whether it was open.
    pub fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Ok while the server takes requests.
    pub fn usable(&self) -> Result<(), SearchError> {
        if let Some(why) = self.poisoned() {
            return Err(SearchError::Poisoned(why));
        }
        if self.is_closed() {
            return Err(SearchError::Closed);
        }
        Ok(())
    }

    /// [`Health::check`] for a poll that found its query unfinished: the
    /// poison at once, the clock (and so the driver) only every
    /// [`POLLS_PER_LOOK`]th such poll of this thread. The worker polls
    /// every query in flight in each pass of its loop, and a clock read
    /// is several times such a poll's load of a mapped word.
    pub fn check_polled(&self, kernel: &Kernel) -> Result<(), SearchError> {
        thread_local!(static POLLS: Cell<u32> = const { Cell::new(0) });
        if let Some(why) = self.poisoned() {
            return Err(SearchError::Poisoned(why));
        }
        let due = POLLS.with(|p| {
            let n = p.get().wrapping_add(1);
            p.set(n);
            n.is_multiple_of(POLLS_PER_LOOK)
        });
        if due {
            self.check(kernel, false)
        } else {
            Ok(())
        }
    }

    /// Is the kernel still running? Asked of the driver at most every
    /// millisecond (`now`: always).
    pub fn check(&self, kernel: &Kernel, now: bool) -> Result<(), SearchError> {
        if let Some(why) = self.poisoned() {
            return Err(SearchError::Poisoned(why));
        }
        let t = self.t0.elapsed().as_micros() as u64 + CHECK_EVERY_US;
        let last = self.last_check_us.load(Ordering::Relaxed);
        let due = now || t >= last + CHECK_EVERY_US;
        if !due || self.last_check_us.compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return Ok(());
        }
        if let Err(e) = kernel.stream.context().bind_to_thread() {
            return Err(self.poison(format!("binding the context: {e:?}"), true));
        }
        match kernel.state() {
            KernelState::Running => Ok(()),
            KernelState::Exited if self.is_closed() => Err(SearchError::Closed),
            KernelState::Exited => Err(self.poison("the search kernel exited".into(), false)),
            KernelState::Failed(e) => Err(self.poison(format!("the search kernel failed: {e}"), true)),
        }
    }
}
