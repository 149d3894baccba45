//! Wakes the backends whose answers the worker wrote, on a thread of its
//! own. Waking a backend that sleeps on its latch is a kill(): several
//! microseconds of the calling thread, the signal's delivery included, for
//! every answer. The worker's one thread submits, polls and answers every
//! query of every backend; at 64 clients and over 100k queries/s those
//! signals took a large share of it, so they go to this thread instead,
//! which spins while answers keep coming and parks when they stop.
//!
//! The thread makes no PostgreSQL call (pgrx refuses them off the main
//! thread): it sets a latch as SetLatch does for another process's latch,
//! from the same fields of shared memory.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pgrx::pg_sys;

/// How long the thread spins for the next answer before it parks.
const SPIN: Duration = Duration::from_micros(500);

struct Shared {
    /// PGPROC numbers of the backends to wake
    pending: Mutex<Vec<i32>>,
    parked: AtomicBool,
    stop: AtomicBool,
}

pub struct Waker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Waker {
    /// The thread, or None when it could not start (wake on the caller's
    /// thread then).
    pub fn start() -> Option<Waker> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Vec::new()),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("gpu_graph waker".into()).spawn(move || run(&s)).ok()?;
        Some(Waker { shared, thread: Some(thread) })
    }

    /// Wakes the process with this PGPROC number soon.
    pub fn wake(&self, procno: i32) {
        self.shared.pending.lock().push(procno);
        // SeqCst with the thread's store of `parked` and its look at
        // `pending`: either it sees this entry or we see it parked
        if self.shared.parked.load(Ordering::SeqCst) {
            if let Some(t) = &self.thread {
                t.thread().unpark();
            }
        }
    }
}

impl Drop for Waker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn run(s: &Shared) {
    crate::threads::block_signals();
    let mut batch = Vec::new();
    let mut last = Instant::now();
    loop {
        std::mem::swap(&mut batch, &mut *s.pending.lock());
        if !batch.is_empty() {
            batch.drain(..).for_each(set_latch);
            last = Instant::now();
            continue;
        }
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        if last.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        s.parked.store(true, Ordering::SeqCst);
        if s.pending.lock().is_empty() && !s.stop.load(Ordering::SeqCst) {
            // (the timeout only bounds a wake-up lost some other way)
            std::thread::park_timeout(Duration::from_millis(100));
        }
        s.parked.store(false, Ordering::SeqCst);
        last = Instant::now();
    }
}

/// PostgreSQL 15's SetLatch for another process's latch: set, then signal
/// the owner only if it may be sleeping on it.
fn set_latch(procno: i32) {
    // SAFETY: ProcGlobal and its allProcs array are set up at server start
    // and live as long as the shared memory; the index is checked against
    // allProcCount; the latch's fields are read and written as SetLatch
    // does, with its barriers.
    unsafe {
        let global = pg_sys::ProcGlobal;
        if procno < 0 || procno as u32 >= (*global).allProcCount {
            return;
        }
        let latch = &raw mut (*(*global).allProcs.add(procno as usize)).procLatch;
        fence(Ordering::SeqCst);
        if std::ptr::read_volatile(&raw const (*latch).is_set) != 0 {
            return;
        }
        std::ptr::write_volatile(&raw mut (*latch).is_set, 1);
        fence(Ordering::SeqCst);
        if std::ptr::read_volatile(&raw const (*latch).maybe_sleeping) == 0 {
            return;
        }
        let owner = std::ptr::read_volatile(&raw const (*latch).owner_pid);
        if owner != 0 && owner != libc::getpid() {
            libc::kill(owner, libc::SIGURG);
        }
    }
}
