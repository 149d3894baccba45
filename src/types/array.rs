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
    // SAFETY: the caller's contract.
    match unsafe { float4s(datum) } {
        None => Err(VectorError::NotReal),
        Some(Float4s { dims: [], .. }) => Ok(&[]),
        Some(Float4s { dims: [_], values }) => values.ok_or(VectorError::HasNulls),
        Some(Float4s { dims, .. }) => Err(VectorError::MultiDim(dims.len() as i32)),
    }
}

/// A float4 array datum: its ARR_DIMS, and its values in row-major order
/// (None when some element is NULL).
struct Float4s<'a> {
    dims: &'a [i32],
    values: Option<&'a [f32]>,
}

/// The datum detoasted into the current memory context when needed (the
/// slices live as long as that context), read in place; None when its
/// elements are not float4.
///
/// # Safety
/// `datum` must be a non-null datum of an array type.
unsafe fn float4s<'a>(datum: pg_sys::Datum) -> Option<Float4s<'a>> {
    // SAFETY: `datum` is a non-null array datum (the caller's contract);
    // pg_detoast_datum returns it, or a detoasted copy in the current memory
    // context, as a whole ArrayType.
    let (arr, ndim, elemtype, dataoffset) = unsafe {
        let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
        (arr, (*arr).ndim, (*arr).elemtype, (*arr).dataoffset)
    };
    if elemtype != pg_sys::FLOAT4OID {
        return None;
    }
    let ndim = ndim.max(0) as usize;
    // ARR_OVERHEAD_NONULLS(ndim): header plus dims and lbounds, MAXALIGNed
    let header = (std::mem::size_of::<pg_sys::ArrayType>() + 2 * ndim * std::mem::size_of::<i32>() + 7) & !7;
    // SAFETY: an array is its header, ARR_DIMS and ARR_LBOUND (ndim each),
    // and, without a null bitmap, the product of the dims float4 values at
    // the MAXALIGNed offset `header`; the array is MAXALIGNed in memory that
    // lives as long as the current memory context.
    unsafe {
        let dims = std::slice::from_raw_parts(
            (arr as *const u8).add(std::mem::size_of::<pg_sys::ArrayType>()) as *const i32,
            ndim,
        );
        let len = if ndim == 0 { 0 } else { dims.iter().map(|&d| d.max(0) as usize).product() };
        // a null bitmap (dataoffset set) means some element is NULL
        let values =
            (dataoffset == 0).then(|| std::slice::from_raw_parts((arr as *const u8).add(header) as *const f32, len));
        Some(Float4s { dims, values })
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
    // SAFETY: the caller's contract.
    match unsafe { float4s(datum) } {
        None => Err(MatrixError::NotReal),
        Some(Float4s { dims: [], .. }) => Ok((0, 0, &[])),
        Some(Float4s { dims: &[rows, cols], values }) => {
            values.map(|v| (rows as usize, cols as usize, v)).ok_or(MatrixError::HasNulls)
        }
        Some(Float4s { dims, .. }) => Err(MatrixError::Shape(dims.len() as i32)),
    }
}

/// Raises the ERROR for a vector that cannot be indexed or compared.
pub fn error(e: VectorError) -> ! {
    pgrx::ereport!(ERROR, pgrx::PgSqlErrorCode::ERRCODE_DATA_EXCEPTION, e.message());
}

/// The first non-finite element, if any. A pass with no early exit first,
/// which the compiler vectorizes (a distance in a query's projection checks
/// both its vectors for every row it returns); the search for the element
/// only when there is one.
pub fn non_finite(v: &[f32]) -> Option<f32> {
    const EXP: u32 = 0x7f80_0000;
    let any = v.iter().fold(0u32, |m, x| m | ((x.to_bits() & EXP) == EXP) as u32);
    if any == 0 {
        return None;
    }
    v.iter().copied().find(|x| !x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::non_finite;

    #[test]
    fn non_finite_finds_the_first() {
        let mut v = vec![1.5f32; 131];
        assert_eq!(non_finite(&v), None);
        assert_eq!(non_finite(&[]), None);
        v[130] = f32::NEG_INFINITY;
        assert_eq!(non_finite(&v), Some(f32::NEG_INFINITY));
        v[7] = f32::INFINITY;
        assert_eq!(non_finite(&v), Some(f32::INFINITY));
        v[3] = f32::NAN;
        assert!(non_finite(&v).is_some_and(f32::is_nan));
        // the largest finite values and subnormals are finite
        assert_eq!(non_finite(&[f32::MAX, f32::MIN, f32::MIN_POSITIVE / 2.0, -0.0]), None);
    }
}
