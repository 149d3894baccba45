//! Threads of a PostgreSQL process that are not its own: the GPU build's
//! thread (and the CUDA driver's threads it starts) and rayon's pool.
//!
//! PostgreSQL's signal handlers assume they interrupt the process's one
//! thread: the SIGALRM handler of statement_timeout walks and rewrites the
//! timeout table that the main thread itself rewrites on its way out of a
//! statement. Linux hands a process-directed signal to any thread that does
//! not block it (another one when the main thread already has one pending),
//! so a handler running on a helper thread, concurrently with the main
//! thread, could corrupt that state. Every helper thread blocks the
//! asynchronous signals, so they all reach the main thread, as PostgreSQL
//! expects.
//!
//! NVRTC's front end puts handlers of its own on SIGINT, SIGTERM and
//! SIGXFSZ early in a process's first compile (process-wide, sigaction),
//! and one of those signals arriving then ends the process with exit
//! status 4 while the compiling thread still runs, which then faults: a
//! cancelled or timed-out GPU build killed its backend with SIGSEGV, and
//! PostgreSQL restarted. A backend therefore keeps those three signals
//! blocked on its main thread while a thread of its may compile
//! ([`NvrtcShield`]) and serves them itself ([`serve_shielded`]): no thread
//! takes them while NVRTC's handlers may be in place.

/// The signals a helper thread blocks: every one but those the kernel
/// raises in the thread that faulted (a fault must still kill the process
/// at once, and Rust's stack-overflow report needs SIGSEGV).
fn asynchronous() -> libc::sigset_t {
    // SAFETY: sigfillset and sigdelset fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGABRT] {
            libc::sigdelset(&mut set, sig);
        }
        set
    }
}

/// Blocks every asynchronous signal in the calling thread (threads it
/// starts inherit that). Call first thing in a thread gpu_graph starts.
pub fn block_signals() {
    let set = asynchronous();
    // SAFETY: pthread_sigmask changes only the calling thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Runs `f` with every signal blocked in the calling thread, then restores
/// its mask: threads started meanwhile (the CUDA driver's, when the search
/// worker opens the GPU on its main thread) keep every signal blocked.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let set = asynchronous();
    // SAFETY: as in block_signals; the old mask is restored below, also if
    // `f` unwinds (the guard's drop).
    let old = unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    struct Restore(libc::sigset_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: restores this thread's own mask as it was.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
        }
    }
    let _restore = Restore(old);
    f()
}

/// rayon's global pool, its threads blocking every signal. Called by each
/// entry point that uses rayon (CREATE INDEX, VACUUM), before its first
/// use; once a process. Not from _PG_init: a preloaded library's _PG_init
/// runs in the postmaster, and threads started there would not survive
/// the fork of a backend (whose pool would then have none).
pub fn init_rayon() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // an error means a pool exists already (built by rayon on a use
        // before this): it stays
        let _ = rayon::ThreadPoolBuilder::new().start_handler(|_| block_signals()).build_global();
    });
}

/// A rayon pool of `threads` threads (at least one), each blocking every
/// signal, for one command's computation (`install` runs it there; nothing
/// that calls into PostgreSQL).
pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .start_handler(|_| block_signals())
        .build()
        .unwrap_or_else(|e| pgrx::error!("gpu_graph: cannot start {threads} threads: {e}"))
}

/// The signals NVRTC's front end takes over while it compiles.
const NVRTC_SIGNALS: [libc::c_int; 3] = gpu_graph_gpu::nvrtc::SIGNALS_TAKEN;

/// What the main thread saved when its first shield went up.
struct Shielded {
    depth: usize,
    /// PostgreSQL's actions for NVRTC_SIGNALS, in that order
    actions: [libc::sigaction; 3],
    /// the thread's signal mask before
    mask: libc::sigset_t,
}

thread_local! {
    static SHIELD: std::cell::RefCell<Option<Shielded>> = const { std::cell::RefCell::new(None) };
}

fn set_of(sigs: impl Iterator<Item = libc::c_int>) -> libc::sigset_t {
    // SAFETY: sigemptyset and sigaddset fill a sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// While it lives, the calling thread (a backend's main thread, before it
/// starts a thread that may compile kernels, and for as long as that
/// thread runs) blocks NVRTC_SIGNALS; [`serve_shielded`] then runs
/// PostgreSQL's handler for each that arrived, and the last shield's drop
/// serves them once more and restores the mask. Shields nest.
pub struct NvrtcShield(());

impl NvrtcShield {
    pub fn new() -> NvrtcShield {
        SHIELD.with(|cell| {
            let mut cur = cell.borrow_mut();
            if let Some(s) = cur.as_mut() {
                s.depth += 1;
                return;
            }
            // SAFETY: reads the actions in place now (PostgreSQL's: no
            // thread of ours compiles yet) and blocks three signals in this
            // thread only.
            unsafe {
                let mut actions: [libc::sigaction; 3] = std::mem::zeroed();
                for (a, &sig) in actions.iter_mut().zip(NVRTC_SIGNALS.iter()) {
                    libc::sigaction(sig, std::ptr::null(), a);
                }
                let mut mask: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, &set_of(NVRTC_SIGNALS.into_iter()), &mut mask);
                *cur = Some(Shielded { depth: 1, actions, mask });
            }
        });
        NvrtcShield(())
    }
}

impl Default for NvrtcShield {
    fn default() -> Self {
        NvrtcShield::new()
    }
}

impl Drop for NvrtcShield {
    fn drop(&mut self) {
        let last = SHIELD.with(|cell| {
            let mut cur = cell.borrow_mut();
            let s = cur.as_mut().expect("a shield is up");
            s.depth -= 1;
            s.depth == 0
        });
        if !last {
            return;
        }
        serve_shielded();
        SHIELD.with(|cell| {
            if let Some(s) = cell.borrow_mut().take() {
                // SAFETY: restores this thread's own mask; a signal still
                // pending (one whose action is the default) is delivered
                // now, to PostgreSQL's action: the threads that compiled
                // have ended.
                unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &s.mask, std::ptr::null_mut()) };
            }
        });
    }
}

/// Under a shield: takes each pending signal of NVRTC_SIGNALS (sigtimedwait:
/// it is never delivered, so NVRTC's handler never runs for it) and runs
/// PostgreSQL's action for it here, as its handler would have (a cancel,
/// statement_timeout or terminate then sets its interrupt flags and the
/// latch); an ignored one is dropped, one left to the default action stays
/// pending until the shield's end. No shield: nothing.
pub fn serve_shielded() {
    let actions = SHIELD.with(|cell| cell.borrow().as_ref().map(|s| s.actions));
    let Some(actions) = actions else { return };
    let handled = |a: &libc::sigaction| a.sa_sigaction != libc::SIG_DFL;
    let set = set_of(NVRTC_SIGNALS.iter().zip(actions.iter()).filter(|(_, a)| handled(a)).map(|(&s, _)| s));
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        // SAFETY: a siginfo_t is plain data, all zeros a valid value;
        // sigtimedwait with a zero timeout takes one pending signal of `set`
        // (blocked in this thread) into it, or returns -1 at once.
        let (sig, mut info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            (libc::sigtimedwait(&set, &mut info, &zero), info)
        };
        if sig <= 0 {
            return;
        }
        let Some(a) = NVRTC_SIGNALS.iter().position(|&s| s == sig).map(|i| actions[i]) else { continue };
        if a.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: PostgreSQL's handler for `sig`, as sigaction reported it
        // (three arguments when installed with SA_SIGINFO); a signal
        // handler's work is safe outside a handler too.
        unsafe {
            if a.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(a.sa_sigaction);
                f(sig, &mut info, std::ptr::null_mut());
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(a.sa_sigaction);
                f(sig);
            }
        }
    }
}
