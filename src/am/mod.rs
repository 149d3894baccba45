//! The access method: one file per PostgreSQL entry point, each thin over the
//! engine and `storage`.

pub mod batch;
pub mod build;
pub mod construct;
pub mod cost;
pub mod info;
pub mod insert;
pub mod loader;
pub mod options;
pub mod paged;
pub mod parallel_scan;
pub mod refine;
pub mod relation;
pub mod scan;
pub mod streamed;
pub mod vacuum;
pub mod vector;
pub mod verify;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgBox;

#[no_mangle]
pub extern "C" fn pg_finfo_gpu_graph_amhandler() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

/// The index_am_handler: what gpu_graph can do and its callbacks.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn gpu_graph_amhandler(_fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: PostgreSQL calls the handler in a backend with a current memory
    // context, where alloc_node pallocs a zeroed node with this tag.
    let mut am = unsafe { PgBox::<pg_sys::IndexAmRoutine>::alloc_node(pg_sys::NodeTag::T_IndexAmRoutine) };
    am.amstrategies = 0;
    am.amsupport = 1;
    am.amoptsprocnum = 0;
    am.amcanorder = false;
    am.amcanorderbyop = true;
    am.amcanbackward = false;
    am.amcanunique = false;
    am.amcanmulticol = false;
    am.amoptionalkey = true;
    am.amsearcharray = false;
    am.amsearchnulls = false;
    am.amstorage = false;
    am.amclusterable = false;
    am.ampredlocks = false;
    am.amcanparallel = false;
    am.amcaninclude = false;
    am.amusemaintenanceworkmem = false;
    am.amparallelvacuumoptions = 0;
    am.amkeytype = pg_sys::InvalidOid;

    am.ambuild = Some(build::ambuild);
    am.ambuildempty = Some(build::ambuildempty);
    am.aminsert = Some(insert::aminsert);
    am.ambulkdelete = Some(vacuum::ambulkdelete);
    am.amvacuumcleanup = Some(vacuum::amvacuumcleanup);
    am.amcostestimate = Some(cost::amcostestimate);
    am.amoptions = Some(options::amoptions);
    am.ambuildphasename = Some(build::ambuildphasename);
    am.amvalidate = Some(amvalidate);
    am.ambeginscan = Some(scan::ambeginscan);
    am.amrescan = Some(scan::amrescan);
    am.amgettuple = Some(scan::amgettuple);
    am.amendscan = Some(scan::amendscan);
    pg_sys::Datum::from(am.into_pg())
}

#[pg_guard]
unsafe extern "C-unwind" fn amvalidate(_opclassoid: pg_sys::Oid) -> bool {
    true
}

extension_sql_file!("../../sql/access_method.sql", name = "access_method", requires = ["distance_operators"]);
