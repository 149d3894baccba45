//! pgvector's `vector` and `halfvec` datums, read directly (the operator
//! classes of the `gpu_graph_pgvector` extension), and which of the three
//! vector types an index's column holds.
//!
//! pgvector's layout (src/vector.h, src/halfvec.h): a varlena header, int16
//! dim, int16 unused, then dim float4 (`vector`) or IEEE binary16
//! (`halfvec`) values. Its input functions refuse NaN and infinity.

use std::ffi::CStr;

use pgrx::pg_sys;

use super::array::MAX_DIM;

thread_local! {
    /// pgvector's type OIDs this backend has named (a type's OID is fixed
    /// while it exists; an index names a dropped type's OID no more).
    static KNOWN: std::cell::RefCell<Vec<(pg_sys::Oid, Column)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The vector type of an index's column: what its operator class takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Real,
    Vector,
    HalfVec,
}

impl Column {
    /// The type of `index`'s one column, by its operator class's input
    /// type (pgvector's types are found by name: their OIDs vary).
    ///
    /// # Safety
    /// `index` must be an open gpu_graph index.
    pub unsafe fn of_index(index: pg_sys::Relation) -> Column {
        // SAFETY: an open index has one opclass input type per key column.
        let oid = unsafe { *(*index).rd_opcintype };
        if oid == pg_sys::FLOAT4ARRAYOID {
            return Column::Real;
        }
        // every scan and insert asks: the name lookup once per type a backend
        if let Some(c) = KNOWN.with_borrow(|k| k.iter().find(|(o, _)| *o == oid).map(|&(_, c)| c)) {
            return c;
        }
        // SAFETY: format_type_be returns a palloc'd C string for any OID.
        let name = unsafe { CStr::from_ptr(pg_sys::format_type_be(oid)) }.to_string_lossy().into_owned();
        // schema-qualified when pgvector's schema is not on the search path
        let column = match name.rsplit('.').next().unwrap_or_default().trim_matches('"') {
            "vector" => Column::Vector,
            "halfvec" => Column::HalfVec,
            _ => pgrx::error!("gpu_graph: columns of type {name} cannot be indexed"),
        };
        KNOWN.with_borrow_mut(|k| k.push((oid, column)));
        column
    }

    /// The most dimensions an index on this type takes: pgvector's index
    /// limits for its types; `real[]`'s is what f16 pages hold.
    pub fn max_dim(self) -> usize {
        match self {
            Column::Real | Column::HalfVec => MAX_DIM,
            Column::Vector => 2000,
        }
    }
}

/// The values of a pgvector datum, detoasted into the current memory
/// context when needed (so the pointer lives as long as that context).
///
/// # Safety
/// `datum` must be a non-null `vector` or `halfvec` datum.
unsafe fn values(datum: pg_sys::Datum) -> (*const u8, usize) {
    // SAFETY: the caller's contract; pg_detoast_datum returns the datum or
    // a detoasted copy, a 4-byte-header varlena: header, int16 dim, int16
    // unused, then the values.
    unsafe {
        let p = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *const u8;
        let dim = std::ptr::read_unaligned(p.add(4) as *const i16);
        (p.add(8), dim.max(0) as usize)
    }
}

/// A `vector` datum's values, in place.
///
/// # Safety
/// `datum` must be a non-null `vector` datum.
pub unsafe fn vector<'a>(datum: pg_sys::Datum) -> &'a [f32] {
    // SAFETY: a vector's float4 values follow its 8-byte header, 4-aligned
    // as the varlena is (palloc'd or on a MAXALIGNed page).
    unsafe {
        let (p, dim) = values(datum);
        std::slice::from_raw_parts(p as *const f32, dim)
    }
}

/// A `halfvec` datum's values, widened to f32 (exactly).
///
/// # Safety
/// `datum` must be a non-null `halfvec` datum.
pub unsafe fn halfvec(datum: pg_sys::Datum) -> Vec<f32> {
    // SAFETY: a halfvec's binary16 values follow its 8-byte header.
    let halves = unsafe {
        let (p, dim) = values(datum);
        std::slice::from_raw_parts(p as *const u16, dim)
    };
    halves.iter().map(|&h| half::f16::from_bits(h).to_f32()).collect()
}
