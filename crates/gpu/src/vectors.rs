//! The stored vectors on the device: n rows of `dp` floats, dp = the stored
//! dimension rounded up to a multiple of 4 (zero padding, so float4 loads
//! work and distances do not change).

use cudarc::driver::CudaSlice;
use rayon::prelude::*;

use crate::device::Gpu;
use crate::error::{cuda, GpuError};

pub(crate) struct DeviceVectors {
    pub x: CudaSlice<f32>,
    pub n: usize,
    pub dim: usize,
    pub dp: usize,
}

/// Sizes of an upload, before it happens.
pub(crate) struct Plan {
    pub n: usize,
    pub dp: usize,
}

impl Plan {
    pub fn bytes(&self) -> usize {
        self.n * self.dp * 4
    }
}

impl DeviceVectors {
    pub fn plan(n: usize, dim: usize) -> Result<Plan, GpuError> {
        // ids are 31 bits in the GRNND pools (bit 31 is the "new" flag)
        if n >= (1usize << 31) {
            return Err(GpuError::Unsupported(format!("{n} rows (the GPU builder takes fewer than 2^31)")));
        }
        if dim == 0 {
            return Err(GpuError::Unsupported("vectors of dimension 0".into()));
        }
        Ok(Plan { n, dp: dim.div_ceil(4) * 4 })
    }

    pub fn upload(gpu: &Gpu, vectors: &[f32], dim: usize) -> Result<DeviceVectors, GpuError> {
        let n = vectors.len() / dim;
        let plan = DeviceVectors::plan(n, dim)?;
        let dp = plan.dp;
        let x = if dp == dim {
            gpu.stream.clone_htod(&vectors[..n * dim])
        } else {
            let mut padded = vec![0f32; n * dp];
            padded.par_chunks_mut(dp).zip(vectors.par_chunks(dim)).for_each(|(o, i)| o[..dim].copy_from_slice(i));
            gpu.stream.clone_htod(&padded)
        }
        .map_err(|e| cuda("uploading the vectors", e))?;
        Ok(DeviceVectors { x, n, dim, dp })
    }

    /// The `n` rows handed over in pieces of consecutive rows by `next`
    /// (None: no more), each copied in as it comes, so the host never holds
    /// more than a piece; also the largest magnitude seen. An error when the
    /// pieces hold other than `n` rows.
    pub fn upload_pieces(
        gpu: &Gpu,
        n: usize,
        dim: usize,
        next: &mut dyn FnMut() -> Option<Vec<f32>>,
    ) -> Result<(DeviceVectors, f32), GpuError> {
        let dp = DeviceVectors::plan(n, dim)?.dp;
        let st = &gpu.stream;
        let mut x = crate::memory::zeroed::<f32>(st, n * dp, "the vectors")?;
        let (mut at, mut maxabs, mut padded) = (0usize, 0f32, Vec::new());
        while let Some(piece) = next() {
            let rows = piece.len() / dim;
            if at + rows > n {
                return Err(GpuError::Unsupported(format!("more than the {n} rows announced")));
            }
            maxabs = maxabs.max(max_abs(&piece));
            let src = if dp == dim {
                &piece[..rows * dim]
            } else {
                padded.clear();
                padded.resize(rows * dp, 0f32);
                padded.par_chunks_mut(dp).zip(piece.par_chunks(dim)).for_each(|(o, i)| o[..dim].copy_from_slice(i));
                &padded[..]
            };
            let mut to = x.slice_mut(at * dp..(at + rows) * dp);
            st.memcpy_htod(src, &mut to).map_err(|e| cuda("uploading the vectors", e))?;
            // the piece goes back to the allocator only once copied
            st.synchronize().map_err(|e| cuda("uploading the vectors", e))?;
            at += rows;
        }
        if at != n {
            return Err(GpuError::Unsupported(format!("{at} rows handed over of the {n} announced")));
        }
        Ok((DeviceVectors { x, n, dim, dp }, maxabs))
    }
}

/// The largest magnitude in `vectors` (NaN when one is).
pub(crate) fn max_abs(vectors: &[f32]) -> f32 {
    vectors.par_chunks(1 << 16).map(|c| c.iter().fold(0f32, |m, &x| m.max(x.abs()))).reduce(|| 0.0, f32::max)
}
