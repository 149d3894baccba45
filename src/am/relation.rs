//! Opening a gpu_graph index named by the caller of a SQL function.

use pgrx::pg_sys;
use pgrx::prelude::*;

/// The index `oid`, opened with `lock`, or an ERROR naming `caller` when it
/// is not a gpu_graph index. Close it with `pg_sys::index_close`.
///
/// # Safety
/// In a transaction.
pub unsafe fn open_gpu_graph_index(oid: pg_sys::Oid, lock: pg_sys::LOCKMODE, caller: &str) -> pg_sys::Relation {
    // SAFETY: index_open raises an ERROR unless `oid` names an index, which
    // stays open (and locked) until index_close; its access method decides
    // whether it is read as a gpu_graph index.
    unsafe {
        let rel = pg_sys::index_open(oid, lock);
        let ours = pg_sys::get_am_oid(c"gpu_graph".as_ptr(), false);
        if (*(*rel).rd_rel).relam != ours {
            pg_sys::index_close(rel, lock);
            error!("{caller}: \"{}\" is not a gpu_graph index", name_of(oid));
        }
        // a partitioned table's index has no pages of its own
        if (*(*rel).rd_rel).relkind as u8 == pg_sys::RELKIND_PARTITIONED_INDEX {
            let name = name_of(oid);
            pg_sys::index_close(rel, lock);
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_WRONG_OBJECT_TYPE,
                format!("{caller}: \"{name}\" is a partitioned index, which has no pages of its own"),
                "Name the index of one of its partitions."
            );
        }
        rel
    }
}

/// The name of relation `oid` ("" if it has none).
///
/// # Safety
/// In a transaction.
pub unsafe fn name_of(oid: pg_sys::Oid) -> String {
    // SAFETY: a syscache lookup; a palloc'd name or NULL.
    let name = unsafe { pg_sys::get_rel_name(oid) };
    if name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null result is a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into()
    }
}
