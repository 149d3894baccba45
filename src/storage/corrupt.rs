//! What a damaged page raises: ERRCODE_INDEX_CORRUPTED naming the index and
//! the block, as btree and amcheck do, never a Rust panic's "index out of
//! bounds" or "attempt to divide by zero".

use pgrx::pg_sys;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;

/// ERROR: `rel`'s block `block` holds something no gpu_graph write makes.
///
/// # Safety
/// `rel` must be an open relation.
pub unsafe fn corrupted(rel: pg_sys::Relation, block: u32, what: impl std::fmt::Display) -> ! {
    // SAFETY: an open relation's relcache entry has its pg_class row.
    let name =
        unsafe { std::ffi::CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr()).to_string_lossy().into_owned() };
    ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INDEX_CORRUPTED,
        format!("gpu_graph index \"{name}\" is corrupted at block {block}: {what}"),
        "gpu_graph",
    )
    .set_hint("REINDEX the index; gpu_graph_verify() lists what else is damaged.")
    .report(PgLogLevel::ERROR);
    unreachable!("an ERROR does not return")
}
