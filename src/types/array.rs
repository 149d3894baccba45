//! Reading a `real[]` datum as a `&[f32]` without copying, with the checks
//! every path (operators, build, insert, scan) applies the same way.

use pgrx::pg_sys;

/// The most dimensions of any gpu_graph vector: what an f16 index stores
/// (an index with f32 storage takes at most 2000: `Element::max_dim`).
pub const MAX_DIM: usize = 4000;

/// Why a real[] cannot be used as a vector.
#[derive(Debug, Clone, PartialEq)]
pub enum VectorError {
    MultiDim(i32),
    HasNulls,
    NotReal,
}

impl VectorError {
    pub fn message(&self) -> String {
        match self {
            VectorError::MultiDim(n) => {
                format!("gpu_graph vectors must be one-dimensional arrays, not {n}-dimensional")
            }
            VectorError::HasNulls => "gpu_graph vectors must not contain NULL elements".into(),
            VectorError::NotReal => "gpu_graph vectors must be real[]".into(),
        }
    }
}

/// The elements of a real[] datum. The datum is detoasted into the current
/// memory context when needed, so the slice lives as long as that context.
///
/// # Safety
/// `datum` must be a non-null datum of an array type.
pub unsafe fn real_array<'a>(datum: pg_sys::Datum) -> Result<&'a [f32], VectorError> {
    // SAFETY: `datum` is a non-null array datum (the caller's contract);
    // pg_detoast_datum returns it, or a detoasted copy in the current memory
    // context, as a whole ArrayType.
    let (arr, ndim, elemtype, dataoffset) = unsafe {
        let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        (arr, (*arr).ndim, (*arr).elemtype, (*arr).dataoffset)
    };
    if elemtype != pg_sys::FLOAT4OID {
        return Err(VectorError::NotReal);
    }
    if ndim == 0 {
        return Ok(&[]);
    }
    if ndim != 1 {
        return Err(VectorError::MultiDim(ndim));
    }
    if dataoffset != 0 {
        // a null bitmap is present: some element is NULL
        return Err(VectorError::HasNulls);
    }
    // ARR_OVERHEAD_NONULLS(1): header plus dims and lbound, MAXALIGNed
    let header = (std::mem::size_of::<pg_sys::ArrayType>() + 2 * std::mem::size_of::<i32>() + 7) & !7;
    // SAFETY: a one-dimensional float4 array without a null bitmap is its
    // header, ARR_DIMS (the length) and ARR_LBOUND, then `len` float4 values
    // at the MAXALIGNed offset `header`; the array is MAXALIGNed in memory
    // that lives as long as the current memory context.
    unsafe {
        let len = *((arr as *const u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *const i32) as usize;
        Ok(std::slice::from_raw_parts((arr as *const u8).add(header) as *const f32, len))
    }
}

/// Why a real[] cannot be used as a batch of queries.
#[derive(Debug, Clone, PartialEq)]
pub enum MatrixError {
    /// not two-dimensional (the number of dimensions it has)
    Shape(i32),
    HasNulls,
    NotReal,
}

impl MatrixError {
    pub fn message(&self) -> String {
        match self {
            MatrixError::Shape(n) => format!(
                "gpu_graph queries must be a two-dimensional real[] array, one row per query, not {n}-dimensional"
            ),
            MatrixError::HasNulls => "gpu_graph queries must not contain NULL elements".into(),
            MatrixError::NotReal => "gpu_graph queries must be real[]".into(),
        }
    }
}

/// The rows of a two-dimensional real[] datum (a batch of queries, each a
/// row): their number, their length and the values, row after row. An
/// empty array is no rows. Detoasted like `real_array`.
///
/// # Safety
/// `datum` must be a non-null datum of an array type.
pub unsafe fn real_matrix<'a>(datum: pg_sys::Datum) -> Result<(usize, usize, &'a [f32]), MatrixError> {
    // SAFETY: as in real_array.
    let (arr, ndim, elemtype, dataoffset) = unsafe {
        let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        (arr, (*arr).ndim, (*arr).elemtype, (*arr).dataoffset)
    };
    if elemtype != pg_sys::FLOAT4OID {
        return Err(MatrixError::NotReal);
    }
    if ndim == 0 {
        return Ok((0, 0, &[]));
    }
    if ndim != 2 {
        return Err(MatrixError::Shape(ndim));
    }
    if dataoffset != 0 {
        return Err(MatrixError::HasNulls);
    }
    // ARR_OVERHEAD_NONULLS(2): header plus two dims and two lbounds, MAXALIGNed
    let header = (std::mem::size_of::<pg_sys::ArrayType>() + 4 * std::mem::size_of::<i32>() + 7) & !7;
    // SAFETY: a two-dimensional float4 array without a null bitmap is its
    // header, ARR_DIMS (rows, columns), ARR_LBOUND, then rows x columns
    // float4 values in row-major order at the offset `header`.
    unsafe {
        let dims = (arr as *const u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *const i32;
        let (rows, cols) = (*dims as usize, *dims.add(1) as usize);
        Ok((rows, cols, std::slice::from_raw_parts((arr as *const u8).add(header) as *const f32, rows * cols)))
    }
}

/// Raises the ERROR for a vector that cannot be indexed or compared.
pub fn error(e: VectorError) -> ! {
    pgrx::ereport!(ERROR, pgrx::PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, e.message());
}

/// The first non-finite element, if any.
pub fn non_finite(v: &[f32]) -> Option<f32> {
    v.iter().copied().find(|x| !x.is_finite())
}
