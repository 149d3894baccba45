//! Compiling the kernels of `kernels/` with NVRTC: at first use, for the
//! device's architecture, once per process.
//!
//! The sources are embedded in the binary (include_str!), so the extension
//! needs no file beside it. They include no header: NVRTC has no toolkit
//! headers on a machine that only has the driver and libnvrtc.
//!
//! Target: real machine code (`sm_XY`, a CUBIN: nothing left for the
//! driver's JIT) when this NVRTC knows the device's architecture, else PTX for
//! the newest virtual architecture it knows that the device can run
//! (`compute_XY`), which the driver compiles at load.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::sys;

use crate::error::GpuError;
use crate::loader;

/// A kernel source file of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelSource {
    pub name: &'static str,
    pub src: &'static str,
}

pub const RNN_DESCENT: KernelSource =
    KernelSource { name: "rnn_descent.cu", src: include_str!("../../../kernels/rnn_descent.cu") };
pub const KNN_EXACT: KernelSource =
    KernelSource { name: "knn_exact.cu", src: include_str!("../../../kernels/knn_exact.cu") };

/// Every kernel file, for the compile check.
pub const ALL: &[KernelSource] = &[RNN_DESCENT, KNN_EXACT];

/// What to compile for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for sm_<cc> (e.g. 90).
    Cubin(u32),
    /// PTX for compute_<cc>.
    Ptx(u32),
}

impl Target {
    pub fn option(&self) -> String {
        match self {
            Target::Cubin(a) => format!("--gpu-architecture=sm_{a}"),
            Target::Ptx(a) => format!("--gpu-architecture=compute_{a}"),
        }
    }
}

/// A compiled kernel file.
#[derive(Debug)]
pub struct Compiled {
    pub target: Target,
    /// CUBIN bytes, or PTX text with its terminating NUL.
    pub image: Vec<u8>,
    /// NVRTC's log: empty unless it warned.
    pub log: String,
    pub compile_ms: f64,
}

fn check(what: &str, r: sys::nvrtcResult) -> Result<(), GpuError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Cuda(format!("NVRTC {what}: {r:?}")))
    }
}

/// NVRTC's version (major, minor).
pub fn version() -> Result<(i32, i32), GpuError> {
    loader::load_nvrtc()?;
    crate::error::guard("nvrtcVersion", || {
        let (mut a, mut b) = (0 as c_int, 0 as c_int);
        check("version", unsafe { sys::nvrtcVersion(&mut a, &mut b) })?;
        Ok((a, b))
    })
}

/// The architectures (e.g. 75, 80, 90, 100) this NVRTC can compile for.
pub fn supported_archs() -> Result<Vec<u32>, GpuError> {
    loader::load_nvrtc()?;
    crate::error::guard("nvrtcGetSupportedArchs", || {
        let mut n: c_int = 0;
        check("supported archs", unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?;
        let mut v = vec![0 as c_int; n.max(0) as usize];
        check("supported archs", unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) })?;
        Ok(v.into_iter().map(|a| a as u32).collect())
    })
}

/// The target for a device of compute capability (major, minor).
pub fn target_for(cc: (i32, i32)) -> Result<Target, GpuError> {
    let arch = (cc.0 * 10 + cc.1) as u32;
    let archs = supported_archs()?;
    if archs.contains(&arch) {
        return Ok(Target::Cubin(arch));
    }
    match archs.iter().copied().filter(|&a| a <= arch).max() {
        Some(a) => Ok(Target::Ptx(a)),
        None => Err(GpuError::NoDevice(format!(
            "this NVRTC cannot compile for compute capability {}.{} (it knows {:?})",
            cc.0, cc.1, archs
        ))),
    }
}

/// Compiles one kernel file. `extra` are further NVRTC options (include
/// folders for the compile check, say). Errors carry NVRTC's log.
pub fn compile(k: &KernelSource, target: &Target, extra: &[String]) -> Result<Compiled, GpuError> {
    loader::load_nvrtc()?;
    crate::error::guard("NVRTC", || compile_inner(k, target, extra))
}

fn compile_inner(k: &KernelSource, target: &Target, extra: &[String]) -> Result<Compiled, GpuError> {
    let t0 = std::time::Instant::now();
    let src = CString::new(k.src).map_err(|_| GpuError::Cuda(format!("{}: NUL in source", k.name)))?;
    let name = CString::new(k.name).unwrap();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    check("create program", unsafe {
        sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null())
    })?;
    struct Prog(sys::nvrtcProgram);
    impl Drop for Prog {
        fn drop(&mut self) {
            unsafe {
                sys::nvrtcDestroyProgram(&mut self.0);
            }
        }
    }
    let p = Prog(prog);
    let mut opts: Vec<String> = vec![target.option(), "-std=c++17".into()];
    opts.extend(extra.iter().cloned());
    let copts: Vec<CString> = opts.iter().map(|o| CString::new(o.as_str()).unwrap()).collect();
    let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let r = unsafe { sys::nvrtcCompileProgram(p.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    let log = unsafe {
        let mut n = 0usize;
        sys::nvrtcGetProgramLogSize(p.0, &mut n);
        let mut buf = vec![0 as c_char; n.max(1)];
        sys::nvrtcGetProgramLog(p.0, buf.as_mut_ptr());
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().trim().to_string()
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(GpuError::Compile {
            kernel: k.name.to_string(),
            log: if log.is_empty() { format!("{r:?}") } else { log },
        });
    }
    let image = unsafe {
        match target {
            Target::Cubin(_) => {
                let mut n = 0usize;
                check("cubin size", sys::nvrtcGetCUBINSize(p.0, &mut n))?;
                let mut buf = vec![0u8; n];
                check("cubin", sys::nvrtcGetCUBIN(p.0, buf.as_mut_ptr() as *mut c_char))?;
                buf
            }
            Target::Ptx(_) => {
                let mut n = 0usize;
                check("ptx size", sys::nvrtcGetPTXSize(p.0, &mut n))?;
                let mut buf = vec![0u8; n];
                check("ptx", sys::nvrtcGetPTX(p.0, buf.as_mut_ptr() as *mut c_char))?;
                buf
            }
        }
    };
    Ok(Compiled { target: target.clone(), image, log, compile_ms: t0.elapsed().as_secs_f64() * 1e3 })
}

type Cache = Mutex<HashMap<(&'static str, Target, Vec<String>), Arc<Compiled>>>;
static CACHE: OnceLock<Cache> = OnceLock::new();

/// The compiled kernel file for `target` with `options` (e.g. `-DNAME=1`),
/// compiling it on first use in this process. A failed compile is not
/// cached (it is retried next time). (NVRTC 12.9+ also keeps a cache of its
/// own across processes: a second process compiled rnn_descent.cu in ~30 ms
/// instead of ~500 ms on the GPU machine.)
pub fn compiled(k: &KernelSource, target: &Target, options: &[String]) -> Result<Arc<Compiled>, GpuError> {
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (k.name, target.clone(), options.to_vec());
    if let Some(c) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(c.clone());
    }
    // compiled outside the lock; two threads racing both compile, one wins
    let c = Arc::new(compile(k, target, options)?);
    Ok(cache.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_insert(c).clone())
}
