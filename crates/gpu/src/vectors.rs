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
}
