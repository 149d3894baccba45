//! The worker's own core (gpu_graph.worker_core).
//!
//! The worker's main thread never sleeps while it serves: it polls the
//! slots and the device. Sharing the machine's cores fairly with the
//! backends, it waited runnable for a core 28-33% of the time at 64
//! clients and 5,000 inserts/s on the 16-core GPU machine (schedstat; 7-9%
//! read-only), and every answer waited with it. So the worker keeps one
//! core to its main thread (the last one it may run on) and one to its
//! answer thread (the one before), and every backend that asks it for a
//! search, or vacuums a gpu_graph index (the repair's threads take every
//! core they may), keeps off those cores from then on: the worker is then
//! on its cores whenever it has work. Only the worker's threads and those
//! backends change their affinity (each its own: no privilege needed); the
//! CUDA driver's threads, other backends and every other process run where
//! they did.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use crate::gucs::{Switch, WORKER_CORE};

/// Below this many cores (the worker's allowed set) `auto` keeps none: a
/// core is then too large a share to set aside.
const AUTO_MIN_CORES: usize = 8;

/// The calling thread's allowed cores.
fn allowed() -> Option<libc::cpu_set_t> {
    // SAFETY: sched_getaffinity writes the set we own, of its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

/// Sets the calling thread's allowed cores (pid 0: this thread alone).
fn set_allowed(set: &libc::cpu_set_t) -> bool {
    // SAFETY: reads the set we own, of its size.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) == 0 }
}

fn cores(set: &libc::cpu_set_t) -> impl DoubleEndedIterator<Item = usize> + '_ {
    // SAFETY: CPU_ISSET reads the set below its size.
    (0..libc::CPU_SETSIZE as usize).filter(move |&c| unsafe { libc::CPU_ISSET(c, set) })
}

/// The cores this thread (the worker's main thread, or a backend) was
/// allowed before gpu_graph changed them: what it goes back to.
fn original() -> Option<&'static libc::cpu_set_t> {
    static ORIGINAL: OnceLock<Option<libc::cpu_set_t>> = OnceLock::new();
    ORIGINAL.get_or_init(allowed).as_ref()
}

/// The cores the worker keeps: its main thread's, and its answer
/// thread's when there are enough cores to give it one (worker::answerer).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Kept {
    pub main: usize,
    pub answers: Option<usize>,
}

impl Kept {
    /// As shared memory holds it (0: none kept).
    pub fn encode(k: Option<Kept>) -> i32 {
        k.map_or(0, |k| (k.main as i32 + 1) | (k.answers.map_or(0, |c| c as i32 + 1) << 16))
    }

    /// The main thread's core and the answer thread's (-1: none).
    pub fn decode(v: i32) -> (i32, i32) {
        ((v & 0xFFFF) - 1, ((v >> 16) & 0xFFFF) - 1)
    }
}

/// The worker: keeps a core to its main thread and one to its answer
/// thread, or none, as gpu_graph.worker_core says (`on_gpu`: the worker
/// searches on a GPU); the main thread then runs on its own. Called on the
/// main thread at the worker's start and after each configuration reload.
pub fn keep_for_worker(on_gpu: bool) -> Option<Kept> {
    let orig = original()?;
    let n = cores(orig).count();
    let wanted = match WORKER_CORE.get() {
        Switch::Off => false,
        Switch::On => n >= 2,
        Switch::Auto => on_gpu && n >= AUTO_MIN_CORES,
    };
    let mut last = cores(orig).rev();
    let kept = match (wanted, last.next()) {
        // a second core to the answer thread only where at least two stay
        // for everything else
        (true, Some(main)) => Some(Kept { main, answers: last.next().filter(|_| n >= 4) }),
        _ => None,
    };
    let main_only = run_on(kept.map(|k| k.main));
    kept.filter(|_| main_only)
}

/// Runs the calling thread on `core` alone, or (None) where the process
/// was allowed to at first; whether that took.
pub fn run_on(core: Option<usize>) -> bool {
    let Some(orig) = original() else { return false };
    let set = match core {
        Some(c) => {
            // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET
            // writes below its size (c < CPU_SETSIZE).
            unsafe {
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(c, &mut one);
                one
            }
        }
        None => *orig,
    };
    set_allowed(&set)
}

/// The cores this backend keeps off now (Kept::encode; -1: not set yet).
static KEPT_OFF: AtomicI32 = AtomicI32::new(-1);

/// A backend about to ask the worker: keeps off the worker's cores
/// (`kept`, as Kept::encode gives them), or runs where it did once the
/// worker keeps none. One atomic load when nothing changed.
pub fn keep_off(kept: i32) {
    if KEPT_OFF.load(Ordering::Relaxed) == kept {
        return;
    }
    let Some(orig) = original() else { return };
    let mut set = *orig;
    let (main, answers) = Kept::decode(kept);
    for core in [main, answers] {
        if core >= 0 && (core as usize) < libc::CPU_SETSIZE as usize && cores(&set).nth(1).is_some() {
            // SAFETY: CPU_CLR writes below the set's size (core <
            // CPU_SETSIZE, as the worker's own set held it).
            unsafe { libc::CPU_CLR(core as usize, &mut set) };
        }
    }
    if cores(&set).next().is_some() {
        set_allowed(&set);
    }
    // (tried once a change: a backend whose affinity cannot change asks
    // the worker as it is)
    KEPT_OFF.store(kept, Ordering::Relaxed);
}
