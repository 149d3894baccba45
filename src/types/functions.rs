//! Distance functions on real[] and the operators built on them. They call
//! the engine's distance kernels, the same code the index ranks with.

use gpu_graph_engine::distance;
use pgrx::pg_sys;
use pgrx::prelude::*;

use super::array::{error, non_finite, real_array};

/// Both arguments of a distance function, checked alike.
///
/// # Safety
/// `fcinfo` must be the call of a strict function of two real[] arguments.
unsafe fn two_vectors<'a>(fcinfo: pg_sys::FunctionCallInfo) -> (&'a [f32], &'a [f32]) {
    // SAFETY: a strict function is called with two non-null arguments, here
    // real[] datums (the caller's contract).
    let (a, b) = unsafe {
        (
            real_array(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0)),
            real_array(pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1)),
        )
    };
    let a = a.unwrap_or_else(|e| error(e));
    let b = b.unwrap_or_else(|e| error(e));
    if a.len() != b.len() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("different vector dimensions {} and {}", a.len(), b.len())
        );
    }
    // as the index refuses such rows, and pgvector such vectors: a NaN
    // distance would sort anywhere
    if let Some(x) = non_finite(a).or_else(|| non_finite(b)) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!("gpu_graph vectors must not contain NaN or infinity, found {x}")
        );
    }
    (a, b)
}

/// Declares a strict SQL function `name(real[], real[]) returns float8` over
/// a distance kernel, with the V1 call convention.
macro_rules! distance_fn {
    ($name:ident, $finfo:ident, $kernel:expr) => {
        #[no_mangle]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
        #[pg_guard]
        #[no_mangle]
        pub unsafe extern "C-unwind" fn $name(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            // SAFETY: sql/operators.sql declares the function STRICT, of
            // two real[] arguments.
            let (a, b) = unsafe { two_vectors(fcinfo) };
            let d: f64 = ($kernel)(a, b);
            pg_sys::Datum::from(d.to_bits())
        }
    };
}

distance_fn!(gpu_graph_l2_distance, pg_finfo_gpu_graph_l2_distance, distance::l2_distance);
distance_fn!(gpu_graph_cosine_distance, pg_finfo_gpu_graph_cosine_distance, distance::cosine_distance);
distance_fn!(gpu_graph_inner_product, pg_finfo_gpu_graph_inner_product, distance::inner_product);
distance_fn!(
    gpu_graph_negative_inner_product,
    pg_finfo_gpu_graph_negative_inner_product,
    distance::negative_inner_product
);

extension_sql_file!("../../sql/operators.sql", name = "distance_operators");
