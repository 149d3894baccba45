//! The worker's wake-ups of the backends it answered, sent from a thread
//! of their own.
//!
//! Waking a backend asleep on its latch is a signal (SetLatch sends
//! SIGURG): a system call that makes the kernel wake another process. On
//! an H100 at 64 clients it was 45% of the busy time of the worker's main
//! thread, the one thread that takes, starts and answers every query
//! (`requests.wake_ms` in gpu_graph_worker_stats()). The main thread now
//! only queues the backend's PGPROC number; this thread sets the latches.
//! It spins while answers come (yielding its core now and then) and parks
//! after a quiet spell; the main thread unparks it (a futex call) only for
//! the first answer after one.
//!
//! The thread never calls into PostgreSQL (pgrx allows that only on the
//! main thread): it sets a latch as latch.c's SetLatch does for another
//! process's latch, and blocks every signal (the process's signals are the
//! main thread's to handle).

use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use pgrx::pg_sys;

/// Procnos the ring holds; an answer that finds it full wakes its backend
/// on the main thread.
const RING: usize = 4096;

/// A ring of PGPROC numbers from the main thread (the one producer) to the
/// waker thread (the one consumer): no lock, and while it is empty the
/// waker's spin only reads `tail`, so the main thread's cache lines stay
/// its own (a mutex both threads took cut the main thread's rate).
struct Waker {
    slots: Box<[AtomicI32]>,
    /// entries ever pushed (the producer's) and taken (the consumer's)
    tail: AtomicUsize,
    head: AtomicUsize,
    parked: AtomicBool,
    thread: Thread,
}

static WAKER: OnceLock<Arc<Waker>> = OnceLock::new();

/// The server's PGPROC array and its length, and this process's pid.
#[derive(Clone, Copy)]
struct Procs {
    all: *mut pg_sys::PGPROC,
    count: u32,
    me: i32,
}

// SAFETY: the PGPROC array lives in shared memory as long as the server;
// the thread touches only each latch's words, as any process may.
unsafe impl Send for Procs {}

/// How long the thread spins for more answers before it parks, on a GPU
/// (whose answers come every few microseconds under load).
pub const GPU_SPIN: Duration = Duration::from_micros(50);

/// Starts the thread (the worker's main thread, once), spinning `spin`
/// after each answer.
pub fn start(spin: Duration) {
    // SAFETY: ProcGlobal and MyProcPid are set before a worker's main
    // function runs; read on the main thread.
    let procs = unsafe {
        Procs { all: (*pg_sys::ProcGlobal).allProcs, count: (*pg_sys::ProcGlobal).allProcCount, me: pg_sys::MyProcPid }
    };
    // the thread starts with every signal blocked (it inherits the mask),
    // the main thread's own mask restored after
    let old = block_signals();
    let spawned = std::thread::Builder::new().name("gpu_graph waker".into()).spawn(move || {
        let w = loop {
            match WAKER.get() {
                Some(w) => break w.clone(),
                None => std::thread::park_timeout(Duration::from_millis(1)),
            }
        };
        run(&w, procs, spin)
    });
    restore_signals(&old);
    match spawned {
        Ok(handle) => {
            let w = Arc::new(Waker {
                slots: (0..RING).map(|_| AtomicI32::new(-1)).collect(),
                tail: AtomicUsize::new(0),
                head: AtomicUsize::new(0),
                parked: AtomicBool::new(false),
                thread: handle.thread().clone(),
            });
            let _ = WAKER.set(w);
        }
        // the main thread wakes the backends itself
        Err(e) => pgrx::log!("gpu_graph search worker: no thread for wake-ups ({e}): the worker sends them itself"),
    }
}

/// Wakes the process with PGPROC number `procno`: queued for the thread,
/// or at once where there is none (or its ring is full). The worker's main
/// thread alone calls this (the ring's one producer).
pub fn wake(procno: i32) {
    let Some(w) = WAKER.get() else { return super::set_latch(procno) };
    let tail = w.tail.load(Ordering::Relaxed);
    if tail - w.head.load(Ordering::Acquire) == RING {
        return super::set_latch(procno);
    }
    w.slots[tail % RING].store(procno, Ordering::Relaxed);
    w.tail.store(tail + 1, Ordering::Release);
    // (pairs with the thread's fence between `parked` and its last look)
    fence(Ordering::SeqCst);
    if w.parked.load(Ordering::Relaxed) {
        w.thread.unpark();
    }
}

fn run(w: &Waker, procs: Procs, spin: Duration) -> ! {
    let mut last = Instant::now();
    let mut idle = 0u32;
    loop {
        let (head, tail) = (w.head.load(Ordering::Relaxed), w.tail.load(Ordering::Acquire));
        if head != tail {
            for i in head..tail {
                let p = w.slots[i % RING].load(Ordering::Relaxed);
                // SAFETY: the number is checked against the array's length;
                // the array lives as long as the server.
                unsafe { set_latch(procs, p) };
            }
            w.head.store(tail, Ordering::Release);
            (last, idle) = (Instant::now(), 0);
            continue;
        }
        if last.elapsed() < spin {
            // now and then the core goes to whoever else wants it (the
            // backends, when the machine is busy)
            idle += 1;
            if idle.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        w.parked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if w.tail.load(Ordering::Relaxed) == w.head.load(Ordering::Relaxed) {
            // (an unpark between the look and the park makes it return at
            // once; the timeout only bounds a lost one)
            std::thread::park_timeout(Duration::from_millis(100));
        }
        w.parked.store(false, Ordering::Relaxed);
        (last, idle) = (Instant::now(), 0);
    }
}

/// latch.c's SetLatch for another process's latch: set it, and signal its
/// owner if it may be asleep on it.
///
/// # Safety
/// `procs` is the server's PGPROC array.
unsafe fn set_latch(procs: Procs, procno: i32) {
    if procno < 0 || procno as u32 >= procs.count {
        return;
    }
    // SAFETY: within the array (checked above); the latch's words are
    // read and written as SetLatch does, with its barriers.
    unsafe {
        let latch = &raw mut (*procs.all.add(procno as usize)).procLatch;
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
        if owner != 0 && owner != procs.me {
            libc::kill(owner, libc::SIGURG);
        }
    }
}

/// Blocks every signal on this thread; the mask before.
fn block_signals() -> libc::sigset_t {
    // SAFETY: signal sets filled and handed to pthread_sigmask for this
    // thread alone.
    unsafe {
        let (mut all, mut old): (libc::sigset_t, libc::sigset_t) = (std::mem::zeroed(), std::mem::zeroed());
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

/// Sets this thread's signal mask back to `old`.
fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: a mask pthread_sigmask gave, for this thread alone.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}
