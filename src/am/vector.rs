//! The checks a vector passes before the index takes it, the same for
//! CREATE INDEX, INSERT and the query of a scan.

use std::borrow::Cow;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::storage::layout::Element;
use crate::types::array::{non_finite, real_array};
use crate::types::pgvector::{self, Column};

/// Where a vector came from, for error messages: " (row (0,5))" or "".
///
/// # Safety
/// `tid` must be NULL or point at a TID.
pub unsafe fn at_tid(tid: pg_sys::ItemPointer) -> String {
    if tid.is_null() {
        return String::new();
    }
    // SAFETY: a non-null `tid` points at a TID (the caller's contract).
    let (block, offset) = pgrx::itemptr::item_pointer_get_both(unsafe { *tid });
    format!(" (row ({block},{offset}))")
}

pub fn data_error(msg: String) -> ! {
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, msg);
}

/// The vector in `datum`, a value of the index's `column` type, or an
/// ERROR that says what is wrong and where.
///
/// # Safety
/// `datum` must be a non-null datum of `column`'s type.
pub unsafe fn checked<'a>(column: Column, datum: pg_sys::Datum, whence: &dyn Fn() -> String) -> Cow<'a, [f32]> {
    let v: Cow<'a, [f32]> = match column {
        // SAFETY: `datum` is a non-null datum of `column`'s type (the
        // caller's contract).
        Column::Real => match unsafe { real_array(datum) } {
            Ok(v) => Cow::Borrowed(v),
            Err(e) => data_error(format!("{}{}", e.message(), whence())),
        },
        // SAFETY: as above.
        Column::Vector => Cow::Borrowed(unsafe { pgvector::vector(datum) }),
        // SAFETY: as above.
        Column::HalfVec => Cow::Owned(unsafe { pgvector::halfvec(datum) }),
    };
    check_values(&v, column.max_dim(), whence);
    v
}

/// ERROR unless `v` has 1 to `max` dimensions, all finite.
pub fn check_values(v: &[f32], max: usize, whence: &dyn Fn() -> String) {
    if v.is_empty() {
        data_error(format!("gpu_graph vectors must have at least 1 dimension{}", whence()));
    }
    if v.len() > max {
        data_error(format!("gpu_graph vectors can have at most {max} dimensions, not {}{}", v.len(), whence()));
    }
    if let Some(x) = non_finite(v) {
        data_error(format!("gpu_graph vectors must not contain NaN or infinity, found {x}{}", whence()));
    }
}

/// ERROR unless every value of `stored` (a row's stored form) fits `storage`:
/// f16 holds magnitudes up to 65504 and would turn larger ones into
/// infinities, whose distances are NaN.
pub fn check_encodable(storage: Element, stored: &[f32]) {
    if storage != Element::F16 {
        return;
    }
    if let Some(x) = stored.iter().copied().find(|x| x.abs() > F16_MAX) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            format!("gpu_graph: {x} is out of range for storage = 'f16' (magnitudes up to {F16_MAX})"),
            "Use WITH (storage = 'f32') for such values."
        );
    }
}

/// The largest finite f16.
const F16_MAX: f32 = 65504.0;

/// ERROR unless an index of `storage` takes vectors of `dim` dimensions.
pub fn check_storage(storage: Element, dim: usize) {
    if dim > storage.max_dim() {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "gpu_graph: an index with storage = '{}' takes vectors of at most {} dimensions, not {dim}",
                storage.name(),
                storage.max_dim()
            ),
            format!("Use WITH (storage = 'f16') for up to {} dimensions.", Element::F16.max_dim())
        );
    }
}

/// ERROR unless `got` equals the index's dimension count.
pub fn check_dim(expected: usize, got: usize, whence: &dyn Fn() -> String) {
    if expected != got {
        data_error(format!("expected {expected} dimensions, not {got}{}", whence()));
    }
}
