//! The signal mask of the threads a host process starts beside its own
//! (a PostgreSQL backend's GPU threads, rayon's pool, the NVRTC shield's
//! taker): they block every asynchronous signal, so that the host's
//! handlers run on its main thread only (see src/threads.rs).

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
