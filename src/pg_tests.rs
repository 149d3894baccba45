//! In-server tests (cargo pgrx test): the access method through SPI.

use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn operators_match_engine() {
        let d = Spi::get_one::<f64>("SELECT ARRAY[0,0]::real[] <-> ARRAY[3,4]::real[]").unwrap().unwrap();
        assert_eq!(d, 5.0);
        let c = Spi::get_one::<f64>("SELECT ARRAY[1,0]::real[] <=> ARRAY[0,1]::real[]").unwrap().unwrap();
        assert!((c - 1.0).abs() < 1e-12);
        let ip = Spi::get_one::<f64>("SELECT ARRAY[1,2]::real[] <#> ARRAY[3,4]::real[]").unwrap().unwrap();
        assert_eq!(ip, -11.0);
    }

    #[pg_test]
    fn index_scan_finds_exact_neighbours_on_a_grid() {
        // 40×40 integer grid: the true nearest neighbours are known exactly
        Spi::run(
            "CREATE TABLE grid AS SELECT i, ARRAY[(i / 40)::real, (i % 40)::real] AS v FROM generate_series(0, 1599) i",
        )
        .unwrap();
        Spi::run("CREATE INDEX ON grid USING gpu_graph (v)").unwrap();
        Spi::run("SET enable_seqscan = off").unwrap();
        let ids: Vec<i32> = Spi::connect(|c| {
            c.select("SELECT i FROM grid ORDER BY v <-> ARRAY[20.2, 20.1]::real[] LIMIT 1", None, &[])
                .unwrap()
                .map(|r| r.get::<i32>(1).unwrap().unwrap())
                .collect()
        });
        assert_eq!(ids, vec![20 * 40 + 20]);
        let n = Spi::get_one::<i64>(
            "SELECT count(*) FROM (SELECT i FROM grid ORDER BY v <-> ARRAY[0,0]::real[] LIMIT 1600) s",
        )
        .unwrap()
        .unwrap();
        assert_eq!(n, 1600, "a scan must reach every row when asked for all of them");
    }

    #[pg_test]
    fn insert_then_find_and_delete_then_never_return() {
        Spi::run("CREATE TABLE t (id int, v real[])").unwrap();
        Spi::run("CREATE INDEX t_v ON t USING gpu_graph (v)").unwrap();
        Spi::run(
            "INSERT INTO t SELECT i, ARRAY[sin(i)::real, cos(i)::real, (i % 7)::real] FROM generate_series(1, 500) i",
        )
        .unwrap();
        Spi::run("SET enable_seqscan = off").unwrap();
        let first =
            Spi::get_one::<i32>("SELECT id FROM t ORDER BY v <-> ARRAY[sin(77)::real, cos(77)::real, 0::real] LIMIT 1")
                .unwrap()
                .unwrap();
        assert_eq!(first, 77);
        Spi::run("DELETE FROM t WHERE id = 77").unwrap();
        let after =
            Spi::get_one::<i32>("SELECT id FROM t ORDER BY v <-> ARRAY[sin(77)::real, cos(77)::real, 0::real] LIMIT 1")
                .unwrap()
                .unwrap();
        assert_ne!(after, 77);
    }

    /// What NVRTC's front end does at the start of a compile on a thread of
    /// its own (measured on NVRTC 13.0): its own handler on SIGINT,
    /// process-wide, then the old one back; a SIGINT reaches the process
    /// meanwhile (a cancel, or statement_timeout's). Whether the fake
    /// handler ran.
    fn signal_during_a_compile() -> bool {
        use std::sync::atomic::{AtomicBool, Ordering};
        static RAN: AtomicBool = AtomicBool::new(false);
        extern "C" fn fake(_: libc::c_int) {
            RAN.store(true, Ordering::SeqCst);
        }
        RAN.store(false, Ordering::SeqCst);
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::threads::block_signals();
                // SAFETY: swaps SIGINT's action and puts it back, as NVRTC
                // does; the signal goes to this process.
                unsafe {
                    let mut fake_action: libc::sigaction = std::mem::zeroed();
                    fake_action.sa_sigaction = fake as extern "C" fn(libc::c_int) as libc::sighandler_t;
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(libc::SIGINT, &fake_action, &mut old);
                    libc::kill(libc::getpid(), libc::SIGINT);
                    // (a thread that does not block it takes it meanwhile)
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut());
                }
            });
        });
        RAN.load(Ordering::SeqCst)
    }

    /// A cancel during a GPU thread's compile: under the shield it is held
    /// back, never delivered to NVRTC's handler, and served to
    /// PostgreSQL's at the next check (the cancelled GPU build's SIGSEGV).
    #[pg_test(error = "canceling statement due to user request")]
    fn a_cancel_during_a_compile_reaches_postgresql_under_the_shield() {
        let shield = crate::threads::NvrtcShield::new();
        assert!(!signal_during_a_compile(), "the compile's handler took the cancel under the shield");
        crate::latch::check_interrupts();
        drop(shield);
        panic!("the cancel was lost");
    }

    /// A cancel that came under the shield while the backend was busy
    /// elsewhere, then NVRTC's first move in a compile: SIGINT set to
    /// SIG_IGN for a moment and put back (which discards a pending SIGINT:
    /// a cancel lost on the GPU machine, the build running to its end). The
    /// shield's taker has it by then, and the next check raises it.
    #[pg_test(error = "canceling statement due to user request")]
    fn a_cancel_held_under_the_shield_outlives_a_moment_of_sig_ign() {
        let shield = crate::threads::NvrtcShield::new();
        // SAFETY: sends this process a cancel, as pg_cancel_backend does.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
        // the backend busy with something else than its checks
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::thread::scope(|s| {
            s.spawn(|| {
                crate::threads::block_signals();
                // SAFETY: SIGINT's action set to SIG_IGN and put back, as
                // NVRTC's front end does before it installs its handler.
                unsafe {
                    let mut ignore: libc::sigaction = std::mem::zeroed();
                    ignore.sa_sigaction = libc::SIG_IGN;
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(libc::SIGINT, &ignore, &mut old);
                    libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut());
                }
            });
        });
        crate::latch::check_interrupts();
        drop(shield);
        panic!("the cancel was lost");
    }

    /// The same with no shield: the main thread takes the signal while the
    /// compile's handler is in place (NVRTC's ends the process; this one
    /// only notes it), and PostgreSQL never sees the cancel.
    #[pg_test]
    fn without_the_shield_a_compile_takes_the_cancel() {
        assert!(signal_during_a_compile(), "the main thread did not take the signal");
        crate::latch::check_interrupts();
    }
}
