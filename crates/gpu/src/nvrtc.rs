//! Compiling the kernels of `kernels/` with NVRTC: at first use, for the
//! device's architecture, once per process.
//!
//! The sources are embedded in the binary (include_str!), so the extension
//! needs no file beside it. They include only this folder's own headers
//! (abi.h, common.cuh), handed to NVRTC from memory: NVRTC has no toolkit
//! headers on a machine that only has the driver and libnvrtc.
//!
//! Target: real machine code (`sm_XY`, a CUBIN: nothing left for the
//! driver's JIT) when this NVRTC knows the device's architecture, else PTX for
//! the newest virtual architecture it knows that the device can run
//! (`compute_XY`), which the driver compiles at load.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

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
pub const KNN_DESCENT: KernelSource =
    KernelSource { name: "knn_descent.cu", src: include_str!("../../../kernels/knn_descent.cu") };
pub const SEARCH_PERSISTENT: KernelSource =
    KernelSource { name: "search_persistent.cu", src: include_str!("../../../kernels/search_persistent.cu") };
pub const FILTER: KernelSource = KernelSource { name: "filter.cu", src: include_str!("../../../kernels/filter.cu") };

/// Every kernel file, for the compile check.
pub const ALL: &[KernelSource] = &[RNN_DESCENT, KNN_EXACT, KNN_DESCENT, SEARCH_PERSISTENT, FILTER];

/// The headers every kernel may include by name: the host–kernel ABI and the
/// shared device helpers.
pub const ABI_H: KernelSource = KernelSource { name: "abi.h", src: include_str!("../../../kernels/abi.h") };
pub const COMMON_CUH: KernelSource =
    KernelSource { name: "common.cuh", src: include_str!("../../../kernels/common.cuh") };
pub const HEADERS: &[KernelSource] = &[ABI_H, COMMON_CUH];

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
        // SAFETY: two valid out-pointers.
        check("version", unsafe { sys::nvrtcVersion(&mut a, &mut b) })?;
        Ok((a, b))
    })
}

/// The architectures (e.g. 75, 80, 90, 100) this NVRTC can compile for.
pub fn supported_archs() -> Result<Vec<u32>, GpuError> {
    loader::load_nvrtc()?;
    crate::error::guard("nvrtcGetSupportedArchs", || {
        let mut n: c_int = 0;
        // SAFETY: a valid out-pointer.
        check("supported archs", unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?;
        let mut v = vec![0 as c_int; n.max(0) as usize];
        // SAFETY: `v` has room for the n architectures NVRTC reported.
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

/// Compiles one kernel file with this folder's headers ([`HEADERS`]).
/// `extra` are further NVRTC options (`-DNAME=1`, say). Errors carry NVRTC's
/// log.
pub fn compile(k: &KernelSource, target: &Target, extra: &[String]) -> Result<Compiled, GpuError> {
    compile_with(k, HEADERS, target, extra)
}

/// As [`compile`], with the given headers (the compile check reads them from
/// a working tree).
pub fn compile_with(
    k: &KernelSource,
    headers: &[KernelSource],
    target: &Target,
    extra: &[String],
) -> Result<Compiled, GpuError> {
    loader::load_nvrtc()?;
    crate::error::guard("NVRTC", || {
        let t0 = std::time::Instant::now();
        let prog = Program::new(k, headers)?;
        let mut opts: Vec<String> = vec![target.option(), "-std=c++17".into()];
        opts.extend(extra.iter().cloned());
        let (ok, log) = prog.compile(&opts)?;
        if !ok {
            return Err(GpuError::Compile { kernel: k.name.to_string(), log });
        }
        let image = prog.image(target)?;
        Ok(Compiled { target: target.clone(), image, log, compile_ms: t0.elapsed().as_secs_f64() * 1e3 })
    })
}

/// An NVRTC program, destroyed on drop. Raw NVRTC calls: cudarc's compile
/// functions neither take headers from memory nor return a CUBIN.
struct Program(sys::nvrtcProgram);

fn cstring(s: &str, what: &str) -> Result<CString, GpuError> {
    CString::new(s).map_err(|_| GpuError::Cuda(format!("{what}: NUL in text")))
}

impl Program {
    fn new(k: &KernelSource, headers: &[KernelSource]) -> Result<Program, GpuError> {
        let src = cstring(k.src, k.name)?;
        let name = cstring(k.name, k.name)?;
        let texts: Vec<CString> = headers.iter().map(|h| cstring(h.src, h.name)).collect::<Result<_, _>>()?;
        let names: Vec<CString> = headers.iter().map(|h| cstring(h.name, h.name)).collect::<Result<_, _>>()?;
        let text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer is a NUL-terminated string alive for the call
        // (NVRTC copies them); the two arrays have headers.len() entries.
        check("create program", unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                headers.len() as c_int,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        })?;
        Ok(Program(prog))
    }

    /// Compiles; whether it succeeded, and NVRTC's log (warnings or errors).
    fn compile(&self, opts: &[String]) -> Result<(bool, String), GpuError> {
        let copts: Vec<CString> = opts.iter().map(|o| cstring(o, "an option")).collect::<Result<_, _>>()?;
        let ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: a live program; `ptrs` holds ptrs.len() NUL-terminated options.
        let r = unsafe { sys::nvrtcCompileProgram(self.0, ptrs.len() as c_int, ptrs.as_ptr()) };
        let mut n = 0usize;
        // SAFETY: a live program; the log buffer has the size NVRTC asked for.
        let log = unsafe {
            sys::nvrtcGetProgramLogSize(self.0, &mut n);
            let mut buf = vec![0 as c_char; n.max(1)];
            sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr());
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().trim().to_string()
        };
        let ok = r == sys::nvrtcResult::NVRTC_SUCCESS;
        Ok((ok, if !ok && log.is_empty() { format!("{r:?}") } else { log }))
    }

    /// The compiled image: CUBIN bytes, or PTX text with its NUL.
    fn image(&self, target: &Target) -> Result<Vec<u8>, GpuError> {
        let mut n = 0usize;
        // SAFETY: a compiled program; each buffer has the size NVRTC gave.
        unsafe {
            match target {
                Target::Cubin(_) => {
                    check("cubin size", sys::nvrtcGetCUBINSize(self.0, &mut n))?;
                    let mut buf = vec![0u8; n];
                    check("cubin", sys::nvrtcGetCUBIN(self.0, buf.as_mut_ptr() as *mut c_char))?;
                    Ok(buf)
                }
                Target::Ptx(_) => {
                    check("ptx size", sys::nvrtcGetPTXSize(self.0, &mut n))?;
                    let mut buf = vec![0u8; n];
                    check("ptx", sys::nvrtcGetPTX(self.0, buf.as_mut_ptr() as *mut c_char))?;
                    Ok(buf)
                }
            }
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
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
    if let Some(c) = cache.lock().get(&key) {
        return Ok(c.clone());
    }
    // compiled outside the lock; two threads racing both compile, one wins
    let c = Arc::new(compile(k, target, options)?);
    Ok(cache.lock().entry(key).or_insert(c).clone())
}
