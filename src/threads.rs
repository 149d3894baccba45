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
//! (`NvrtcShield`), a taker thread of the shield takes each as it arrives
//! (NVRTC sets them to SIG_IGN for a moment first, which would discard a
//! pending one), and the backend serves them itself (`serve_shielded`): no
//! thread runs a handler for them while NVRTC's handlers may be in place
//! (the shield is crates/gpu/src/nvrtc_signals.rs, beside what it guards
//! against; the threads' masks crates/gpu/src/thread_signals.rs).

pub use gpu_graph_gpu::nvrtc_signals::{serve_shielded, NvrtcShield};
pub use gpu_graph_gpu::thread_signals::{block_signals, with_signals_blocked};

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
