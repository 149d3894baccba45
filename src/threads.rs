//! Threads of a PostgreSQL process that are not its own: the GPU build's
//! thread (and the CUDA driver's threads it starts) and rayon's pool.
//!
//! PostgreSQL's signal handlers assume they interrupt the process's one
//! thread: the SIGALRM handler of statement_timeout walks and rewrites the
//! timeout table that the main thread itself rewrites on its way out of a
//! statement. Linux hands a process-directed signal to any thread that does
//! not block it (another one when the main thread already has one pending),
//! so a handler running on a helper thread, concurrently with the main
//! thread, could corrupt that state: a GPU build cancelled by
//! statement_timeout crashed the backend (SIGSEGV) in 2 of 4 tries on the
//! H200. Every helper thread blocks all signals, so they all reach the main
//! thread, as PostgreSQL expects.

/// Blocks every signal in the calling thread (threads it starts inherit
/// that). Call first thing in a thread gpu_graph starts.
pub fn block_signals() {
    // SAFETY: sigfillset fills a sigset_t we own; pthread_sigmask changes
    // only the calling thread's mask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// Runs `f` with every signal blocked in the calling thread, then restores
/// its mask: threads started meanwhile (the CUDA driver's, when the search
/// worker opens the GPU on its main thread) keep every signal blocked.
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: as in block_signals; the old mask is restored below, also if
    // `f` unwinds (the guard's drop).
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
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
