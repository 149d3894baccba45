//! Finding libcuda and libnvrtc at run time.
//!
//! cudarc (feature `dynamic-loading`) resolves every CUDA entry point with
//! dlopen by bare library names ("libcuda.so.1", "libnvrtc.so.13", ...), which
//! only finds libraries on the loader's search path: LD_LIBRARY_PATH as it
//! was when the process started, the ldconfig cache and the system folders.
//! On the GPU machine libcuda is /usr/lib/libcuda.so.1 and NVRTC sits under
//! /usr/local/cuda/targets/x86_64-linux/lib, outside that cache, and changing
//! LD_LIBRARY_PATH after start has no effect on dlopen. So we load the
//! library ourselves first, by full path, and keep it loaded: glibc's dlopen
//! of a bare name then matches the already loaded object by its SONAME
//! (libcuda.so.1, libnvrtc.so.13), and cudarc gets our copy. A library we
//! cannot find is reported as an error here, before cudarc is ever called
//! (cudarc panics instead).
//!
//! NVRTC itself dlopens libnvrtc-builtins.so.<major>.<minor> by bare name at
//! its first compile; we preload that one from the same folder too.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::GpuError;

fn env_dirs() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Some(v) = std::env::var_os(var) {
            if !v.is_empty() {
                roots.push(PathBuf::from(v));
            }
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    // versioned installs, newest first
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("cuda-")))
            .collect();
        v.sort();
        v.reverse();
        roots.extend(v);
    }
    let mut dirs = Vec::new();
    for r in roots {
        for sub in ["targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib64", "lib"] {
            dirs.push(r.join(sub));
        }
    }
    dirs
}

fn ld_library_path_dirs() -> Vec<PathBuf> {
    std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
        .unwrap_or_default()
}

/// Loads the first candidate that opens and never unloads it.
fn load_first(cands: &[PathBuf]) -> Result<PathBuf, Vec<String>> {
    let mut errs = Vec::new();
    for c in cands {
        // a full path that is not there: skip without noise
        if c.is_absolute() && !c.exists() {
            continue;
        }
        // SAFETY: loading a shared library runs its initialisers; these are
        // the vendor's CUDA libraries, loaded exactly as cudarc would.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => {
                std::mem::forget(lib);
                return Ok(c.clone());
            }
            Err(e) => errs.push(format!("{}: {e}", c.display())),
        }
    }
    Err(errs)
}

static DRIVER: OnceLock<Result<PathBuf, GpuError>> = OnceLock::new();
static NVRTC: OnceLock<Result<PathBuf, GpuError>> = OnceLock::new();

/// Loads libcuda: `GPU_GRAPH_LIBCUDA` if set, then the loader's own search,
/// then the folders drivers install into. Returns the path that loaded.
pub fn load_driver() -> Result<PathBuf, GpuError> {
    DRIVER
        .get_or_init(|| {
            let mut cands: Vec<PathBuf> = Vec::new();
            if let Some(p) = std::env::var_os("GPU_GRAPH_LIBCUDA") {
                cands.push(PathBuf::from(p));
            }
            for d in ld_library_path_dirs() {
                cands.push(d.join("libcuda.so.1"));
            }
            cands.push(PathBuf::from("libcuda.so.1"));
            for d in [
                "/usr/lib",
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib64",
                "/usr/local/nvidia/lib64",
                "/usr/local/nvidia/lib",
                "/usr/lib/wsl/lib",
                "/usr/lib/aarch64-linux-gnu",
            ] {
                cands.push(Path::new(d).join("libcuda.so.1"));
            }
            load_first(&cands).map_err(|errs| {
                // the bare name's "cannot open shared object file" only says
                // that no driver is installed
                let missing = errs.iter().all(|e| e.contains("cannot open shared object file"));
                GpuError::NoDriver(if missing {
                    "libcuda.so.1 not found (looked on the loader's path, /usr/lib, /usr/lib/x86_64-linux-gnu, \
                     /usr/lib64, /usr/local/nvidia/lib64; set GPU_GRAPH_LIBCUDA to its path)"
                        .into()
                } else {
                    format!("libcuda.so.1 could not be loaded: {}", errs.join("; "))
                })
            })
        })
        .clone()
}

/// Loads libnvrtc (and its builtins beside it): `GPU_GRAPH_LIBNVRTC` if set,
/// LD_LIBRARY_PATH, CUDA_PATH / CUDA_HOME / CUDA_ROOT, /usr/local/cuda and
/// /usr/local/cuda-*, then the loader's own search.
pub fn load_nvrtc() -> Result<PathBuf, GpuError> {
    NVRTC
        .get_or_init(|| {
            let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
            let mut dirs = ld_library_path_dirs();
            dirs.extend(env_dirs());
            let mut cands: Vec<PathBuf> = Vec::new();
            if let Some(p) = std::env::var_os("GPU_GRAPH_LIBNVRTC") {
                cands.push(PathBuf::from(p));
            }
            for d in &dirs {
                for n in names {
                    cands.push(d.join(n));
                }
            }
            for n in names {
                cands.push(PathBuf::from(n));
            }
            let path = load_first(&cands).map_err(|errs| {
                GpuError::NvrtcMissing(if errs.is_empty() {
                    "libnvrtc.so not found (looked on LD_LIBRARY_PATH, CUDA_PATH, CUDA_HOME, /usr/local/cuda*/\
                     targets/x86_64-linux/lib and lib64, and the loader's path; set GPU_GRAPH_LIBNVRTC to its path)"
                        .into()
                } else {
                    format!("libnvrtc could not be loaded: {}", errs.join("; "))
                })
            })?;
            // its builtins: libnvrtc-builtins.so.<major>.<minor>, same folder
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                if let Ok(rd) = std::fs::read_dir(dir) {
                    let mut b: Vec<PathBuf> = rd
                        .filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| {
                            p.file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt."))
                        })
                        .collect();
                    // the longest name carries the full version (…so.13.0)
                    b.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
                    let _ = load_first(&b);
                }
            }
            Ok(path)
        })
        .clone()
}
