//! The worker's own core (gpu_graph.worker_core).
//!
//! The worker's main thread never sleeps while it serves: it polls the
//! slots and the device. Sharing the machine's cores fairly with the
//! backends, it waited runnable for a core 28-33% of the time at 64
//! clients and 5,000 inserts/s on the 16-core GPU machine (schedstat; 7-9%
//! read-only), and every answer waited with it. So the worker keeps one
//! core to its main thread (the last one it may run on), and every backend
//! that asks it for a search, or vacuums a gpu_graph index (the repair's
//! threads take every core they may), keeps off that core from then on:
//! the worker is then on its core whenever it has work. Only the worker's
//! main thread and those backends change their affinity (each its own: no
//! privilege needed); the CUDA driver's threads, other backends and every
//! other process run where they did.

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

/// The worker: keeps a core to its main thread, or none, as
/// gpu_graph.worker_core says (`on_gpu`: the worker searches on a GPU);
/// the core kept (None: none). Called at the worker's start and after
/// each configuration reload.
pub fn keep_for_worker(on_gpu: bool) -> Option<usize> {
    let orig = original()?;
    let n = cores(orig).count();
    let wanted = match WORKER_CORE.get() {
        Switch::Off => false,
        Switch::On => n >= 2,
        Switch::Auto => on_gpu && n >= AUTO_MIN_CORES,
    };
    let core = cores(orig).next_back().filter(|_| wanted);
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
    if set_allowed(&set) {
        core
    } else {
        None
    }
}

/// The core this backend keeps off now (-1: none).
static KEPT_OFF: AtomicI32 = AtomicI32::new(-1);

/// A backend about to ask the worker: keeps off the worker's core (`core`,
/// -1 for none), or runs where it did once the worker keeps none. One
/// atomic load when nothing changed.
pub fn keep_off(core: i32) {
    if KEPT_OFF.load(Ordering::Relaxed) == core {
        return;
    }
    let Some(orig) = original() else { return };
    let mut set = *orig;
    if core >= 0 && (core as usize) < libc::CPU_SETSIZE as usize && cores(orig).nth(1).is_some() {
        // SAFETY: CPU_CLR writes below the set's size (core < CPU_SETSIZE,
        // as the worker's own set held it).
        unsafe { libc::CPU_CLR(core as usize, &mut set) };
    }
    if cores(&set).next().is_some() {
        set_allowed(&set);
    }
    // (tried once a change: a backend whose affinity cannot change asks
    // the worker as it is)
    KEPT_OFF.store(core, Ordering::Relaxed);
}
