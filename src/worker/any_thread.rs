//! Two things of PostgreSQL that the worker's answer thread needs, done
//! without calling into PostgreSQL: pgrx allows its functions on the main
//! thread only (and PostgreSQL's are not written for threads), but waking a
//! backend and reading the clock touch no state of this process.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pgrx::pg_sys;

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_UNIX_SECS: i64 = 946_684_800;

/// GetCurrentTimestamp: microseconds since 2000-01-01 UTC (a TimestampTz).
pub fn timestamp_now() -> i64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64 - POSTGRES_EPOCH_UNIX_SECS) * 1_000_000 + d.subsec_micros() as i64
}

/// Wakes the process with this PGPROC number (a stale number wakes some
/// other process once, which latches allow): PostgreSQL 15's SetLatch on
/// another process's latch (storage/ipc/latch.c), step for step.
pub fn set_latch(procno: i32) {
    // SAFETY: ProcGlobal and its allProcs array are set up at server start
    // and live as long as the shared memory; the index is checked against
    // allProcCount. The latch's words are written by its owner and by
    // setters only as SetLatch does, read and written volatile here with
    // its barriers.
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
        // (the owner sleeps in WaitLatch: PostgreSQL wakes it with SIGURG;
        // a latch of this process, never a backend's, would be woken the
        // same way, the handler then finding it set)
        let pid = std::ptr::read_volatile(&raw const (*latch).owner_pid);
        if pid != 0 {
            libc::kill(pid, libc::SIGURG);
        }
    }
}

/// Lines for the server log from any thread, written by the main thread
/// ([`write_logs`]) at its next pass.
static LOG_LATER: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
/// whether LOG_LATER may hold a line (one load a pass when it holds none)
static LOGS_KEPT: AtomicBool = AtomicBool::new(false);

pub fn log_later(line: String) {
    LOG_LATER.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    LOGS_KEPT.store(true, Ordering::Release);
}

/// The worker's main thread: writes the lines [`log_later`] kept.
pub fn write_logs() {
    if !LOGS_KEPT.swap(false, Ordering::Acquire) {
        return;
    }
    let lines = std::mem::take(&mut *LOG_LATER.lock().unwrap_or_else(|e| e.into_inner()));
    for line in lines {
        pgrx::log!("{line}");
    }
}
