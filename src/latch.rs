//! Waiting on this process's latch: the one way a backend or the search
//! worker sleeps while staying responsive to signals.

use std::time::Duration;

use pgrx::pg_sys;

/// Sleeps on this process's latch up to `timeout` (at least a millisecond):
/// a SetLatch, a signal or the timeout wakes it; the postmaster's death ends
/// the process.
pub fn sleep(timeout: Duration) {
    let ms = timeout.as_micros().div_ceil(1000).max(1) as i64;
    // SAFETY: MyLatch is this process's own latch, set up at its start.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms,
            pg_sys::PG_WAIT_EXTENSION,
        );
    }
}

/// [`sleep`], then the latch reset and pending interrupts served: a cancel,
/// statement_timeout or terminate raises its ERROR (or FATAL) from here.
pub fn nap(timeout: Duration) {
    sleep(timeout);
    // SAFETY: MyLatch is this process's own latch, set up at its start.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    check_interrupts();
}

/// CHECK_FOR_INTERRUPTS, after the signals a [`crate::threads::NvrtcShield`]
/// held back are served: a cancel, statement_timeout or terminate raises
/// its ERROR (or FATAL) from here.
pub fn check_interrupts() {
    crate::threads::serve_shielded();
    pg_sys::check_for_interrupts!();
}
