//! gpu_graph: the PostgreSQL side. Thin glue over `gpu_graph_engine`: one file
//! per access-method callback under `am/`, the page layout and WAL under
//! `storage/`, the SQL types and operators under `types/`, the GPU search
//! worker and its shared-memory ring under `worker/`.

use pgrx::prelude::*;

mod am;
mod gucs;
mod latch;
mod storage;
mod threads;
mod types;
mod worker;

::pgrx::pg_module_magic!();

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    hide_rust_backtraces();
    gucs::register();
    am::options::register();
    worker::register_callbacks();
    // SAFETY: a plain read of a flag PostgreSQL sets while it loads
    // shared_preload_libraries, on the process's only thread.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        gucs::register_postmaster();
        worker::preload();
    }
    // a misspelt gpu_graph.* setting is an ERROR, not a silent placeholder
    // SAFETY: called while the library loads, after its settings are defined.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"gpu_graph".as_ptr()) };
}

/// pgrx turns an ERROR that crosses Rust code into a panic and back, and its
/// panic hook appends a Rust backtrace to the ERROR's DETAIL whenever the
/// server's environment has RUST_BACKTRACE set. Users must never see one:
/// RUST_LIB_BACKTRACE, which std reads first, turns those captures off
/// (a deliberate RUST_LIB_BACKTRACE is left as it is).
fn hide_rust_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: _PG_init runs while the library loads, on the process's
        // only thread (gpu_graph starts its threads later, in builds and
        // in the search worker), so nothing reads the environment meanwhile.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

#[cfg(any(test, feature = "pg_test"))]
mod pg_tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
