//! NVRTC's front end puts handlers of its own on a few signals early in a
//! process's first compile, process-wide, and one of those signals arriving
//! then ends the process (exit status 4) while the compiling thread still
//! runs, which then faults. In a PostgreSQL backend those are a cancel and
//! statement_timeout (SIGINT) and a terminate (SIGTERM): the cancelled GPU
//! build's SIGSEGV. The shield keeps them from the one thread that would
//! take them (a backend's main thread; every thread gpu_graph starts blocks
//! them already) while compiles may run, and serves them to the handlers
//! that were in place before, at the host's own checks.

/// The signals NVRTC's front end puts handlers of its own on early in the
/// first compile of a process (sigaction: process-wide), the old ones back
/// after (NVRTC 13.0, measured: for ~2-40 ms; later compiles left them
/// alone; with SIGINT ignored it leaves SIGINT alone). One of them
/// arriving meanwhile ends the process with exit status 4 while the
/// compiling thread still runs. A host whose threads compile must keep
/// these from every thread meanwhile ([`NvrtcShield`]);
/// `gpu-graph-nvrtc-check` checks the list against this NVRTC.
pub const SIGNALS_TAKEN: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGXFSZ];

/// What the main thread saved when its first shield went up.
struct Shielded {
    depth: usize,
    /// the actions in place for SIGNALS_TAKEN (a backend's: PostgreSQL's), in
    /// that order
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

/// While it lives, the calling thread (a backend's main thread, from before
/// it starts a thread that may compile kernels until that thread has
/// ended) blocks SIGNALS_TAKEN; [`serve_shielded`] then runs the handler in
/// place before (PostgreSQL's) for each that arrived, and the last
/// shield's drop serves them once more and restores the mask. Shields nest;
/// a shield stays on its thread (the state is the thread's).
pub struct NvrtcShield(std::marker::PhantomData<*const ()>);

impl NvrtcShield {
    pub fn new() -> NvrtcShield {
        SHIELD.with(|cell| {
            let mut cur = cell.borrow_mut();
            if let Some(s) = cur.as_mut() {
                s.depth += 1;
                return;
            }
            // SAFETY: reads the actions in place now (the host's: no thread
            // of its compiles yet) and blocks three signals in this
            // thread only.
            unsafe {
                let mut actions: [libc::sigaction; 3] = std::mem::zeroed();
                for (a, &sig) in actions.iter_mut().zip(SIGNALS_TAKEN.iter()) {
                    libc::sigaction(sig, std::ptr::null(), a);
                }
                let mut mask: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, &set_of(SIGNALS_TAKEN.into_iter()), &mut mask);
                *cur = Some(Shielded { depth: 1, actions, mask });
            }
        });
        NvrtcShield(std::marker::PhantomData)
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
                // now, to the host's action: the threads that compiled have
                // ended.
                unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &s.mask, std::ptr::null_mut()) };
            }
        });
    }
}

/// Under a shield: takes each pending signal of SIGNALS_TAKEN (sigtimedwait:
/// it is never delivered, so NVRTC's handler never runs for it) and runs
/// the action in place before for it here, as its handler would have (in a
/// backend a cancel, statement_timeout or terminate then sets its interrupt
/// flags and the latch); an ignored one is dropped, one left to the
/// default action stays pending until the shield's end. No shield: nothing.
pub fn serve_shielded() {
    let actions = SHIELD.with(|cell| cell.borrow().as_ref().map(|s| s.actions));
    let Some(actions) = actions else { return };
    let handled = |a: &libc::sigaction| a.sa_sigaction != libc::SIG_DFL;
    let set = set_of(SIGNALS_TAKEN.iter().zip(actions.iter()).filter(|(_, a)| handled(a)).map(|(&s, _)| s));
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
        let Some(a) = SIGNALS_TAKEN.iter().position(|&s| s == sig).map(|i| actions[i]) else { continue };
        if a.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: the host's handler for `sig`, as sigaction reported it
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
