//! NVRTC's front end puts handlers of its own on a few signals early in a
//! process's first compile, process-wide, and one of those signals arriving
//! then ends the process (exit status 4) while the compiling thread still
//! runs, which then faults. In a PostgreSQL backend those are a cancel and
//! statement_timeout (SIGINT) and a terminate (SIGTERM): the cancelled GPU
//! build's SIGSEGV. The shield keeps them from the one thread that would
//! take them (a backend's main thread; every thread gpu_graph starts blocks
//! them already) while compiles may run, and serves them to the handlers
//! that were in place before, at the host's own checks.
//!
//! Before it installs its handler, the front end sets each signal to
//! SIG_IGN for a moment (the `if (signal(s, SIG_IGN) != SIG_IGN)` idiom),
//! and setting SIG_IGN discards the signal if it is pending. So a signal
//! must not wait, pending, for the host's next check: the shield's taker
//! thread takes each one the moment it arrives and keeps it for the check.

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
    taker: Taker,
}

/// A thread that waits for SIGNALS_TAKEN (sigtimedwait: while it waits, the
/// kernel hands them to it at once, never to a handler) and notes each in
/// `taken` for [`serve_shielded`]: no signal stays pending long enough for
/// NVRTC's SIG_IGN moment to discard it.
struct Taker {
    state: std::sync::Arc<TakerState>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct TakerState {
    stop: std::sync::atomic::AtomicBool,
    /// bit i: SIGNALS_TAKEN[i] arrived and is not yet served
    taken: std::sync::atomic::AtomicU32,
}

impl Taker {
    /// Waits for the signals of `set` until stopped.
    fn start(set: libc::sigset_t) -> Taker {
        use std::sync::atomic::Ordering;
        let state = std::sync::Arc::new(TakerState::default());
        let theirs = state.clone();
        // started with every signal blocked, so that no handler of the host
        // ever runs on it, not even before its first instruction
        let thread = crate::thread_signals::with_signals_blocked(|| {
            std::thread::Builder::new().name("gg-signals".into()).spawn(move || {
                // a bounded wait: the stop flag is seen within it
                let wait = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
                while !theirs.stop.load(Ordering::Acquire) {
                    // SAFETY: sigtimedwait takes one signal of `set` (blocked
                    // in this thread) or times out; `info` is ours.
                    let sig = unsafe {
                        let mut info: libc::siginfo_t = std::mem::zeroed();
                        libc::sigtimedwait(&set, &mut info, &wait)
                    };
                    if let Some(i) = SIGNALS_TAKEN.iter().position(|&s| s == sig) {
                        theirs.taken.fetch_or(1 << i, Ordering::AcqRel);
                    }
                }
            })
        });
        // no thread (the host is out of threads): the signals wait pending
        // for the next check, as they would with no taker
        Taker { state, thread: thread.ok() }
    }

    /// Stops the thread and waits for it (within its 1 ms wait).
    fn stop(&mut self) {
        self.state.stop.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
/// ended) blocks SIGNALS_TAKEN and a taker thread takes each as it arrives;
/// [`serve_shielded`] then runs the handler in place before (PostgreSQL's)
/// for each that arrived, and the last shield's drop stops the taker,
/// serves them once more and restores the mask. Shields nest; a shield
/// stays on its thread (the state is the thread's).
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
                let taker = Taker::start(handled_set(&actions));
                *cur = Some(Shielded { depth: 1, actions, mask, taker });
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
        // the taker's notes and anything still pending, served once more
        SHIELD.with(|cell| cell.borrow_mut().as_mut().map(|s| s.taker.stop()));
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

/// The signals of SIGNALS_TAKEN whose action in `actions` (in that order)
/// is not the default: those the shield takes and serves; one left to the
/// default action stays pending until the shield's end.
fn handled_set(actions: &[libc::sigaction; 3]) -> libc::sigset_t {
    let handled = SIGNALS_TAKEN.iter().zip(actions.iter()).filter(|(_, a)| a.sa_sigaction != libc::SIG_DFL);
    set_of(handled.map(|(&s, _)| s))
}

/// Under a shield: runs the action in place before for each signal of
/// SIGNALS_TAKEN that arrived (the taker's notes, and any still pending,
/// taken with sigtimedwait: never delivered, so NVRTC's handler never runs
/// for one), here, as its handler would have (in a backend a cancel,
/// statement_timeout or terminate then sets its interrupt flags and the
/// latch); an ignored one is dropped. No shield: nothing.
pub fn serve_shielded() {
    use std::sync::atomic::Ordering;
    let shielded = SHIELD.with(|cell| cell.borrow().as_ref().map(|s| (s.actions, s.taker.state.clone())));
    let Some((actions, taker)) = shielded else { return };
    let set = handled_set(&actions);
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let mut arrived = taker.taken.swap(0, Ordering::AcqRel);
    loop {
        // SAFETY: sigtimedwait with a zero timeout takes one pending signal
        // of `set` (blocked in this thread), or returns -1 at once.
        let sig = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigtimedwait(&set, &mut info, &zero)
        };
        match SIGNALS_TAKEN.iter().position(|&s| s == sig) {
            Some(i) => arrived |= 1 << i,
            None if sig > 0 => continue,
            None => break,
        }
    }
    for (i, (&sig, a)) in SIGNALS_TAKEN.iter().zip(actions.iter()).enumerate() {
        if arrived & (1 << i) == 0 || a.sa_sigaction == libc::SIG_IGN || a.sa_sigaction == libc::SIG_DFL {
            continue;
        }
        // SAFETY: the host's handler for `sig`, as sigaction reported it
        // (three arguments when installed with SA_SIGINFO: a siginfo_t
        // naming the signal alone, as for a signal the kernel sent); a
        // signal handler's work is safe outside a handler too.
        unsafe {
            if a.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(a.sa_sigaction);
                let mut info: libc::siginfo_t = std::mem::zeroed();
                info.si_signo = sig;
                f(sig, &mut info, std::ptr::null_mut());
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(a.sa_sigaction);
                f(sig);
            }
        }
    }
}
