//! Compiles every kernel of `kernels/` with NVRTC, through the same compile
//! function the extension uses, and the ABI check (the static_asserts of
//! `abi::static_asserts`, which fail when abi.h and abi.rs disagree); fails
//! on any error or warning. No GPU needed: scripts/check-kernels.sh runs it
//! in CI with NVRTC from PyPI.
//!
//! Without files it checks the kernels and headers embedded in the binary;
//! with files, those kernels with the headers of their folder. One line per
//! kernel and target; exit status 1 if any failed or warned.

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;
use gpu_graph_gpu::abi;
use gpu_graph_gpu::nvrtc::{self, KernelSource, Target};
use gpu_graph_gpu::nvrtc_signals;

#[derive(Parser)]
#[command(about = "Compile the CUDA kernels and the ABI check with NVRTC")]
struct Opts {
    /// Targets: compute_XY (PTX) or sm_XY (a CUBIN, which also runs ptxas).
    #[arg(long = "arch", default_values = ["compute_90"])]
    arch: Vec<String>,
    /// Include folders handed to NVRTC.
    #[arg(short = 'I')]
    include: Vec<String>,
    /// Further NVRTC options (e.g. --option=--ptxas-options=-v to see
    /// registers and spills; its report then counts as a warning).
    #[arg(long = "option", allow_hyphen_values = true)]
    option: Vec<String>,
    /// Writes each image to DIR/NAME.ARCH (a CUBIN for nvdisasm, or PTX).
    #[arg(long = "dump-dir")]
    dump_dir: Option<PathBuf>,
    /// Kernel files to check instead of the embedded ones.
    files: Vec<PathBuf>,
    /// (internal) a child of the signal check: `shielded`, `bare` or `pending`.
    #[arg(long, hide = true)]
    signal_child: Option<String>,
}

fn parse_target(s: &str) -> Target {
    let parsed = s.split_once('_').and_then(|(kind, num)| match (kind, num.parse().ok()?) {
        ("compute", a) => Some(Target::Ptx(a)),
        ("sm", a) => Some(Target::Cubin(a)),
        _ => None,
    });
    parsed.unwrap_or_else(|| common::usage(&format!("bad --arch {s:?} (compute_90, sm_90, ...)")))
}

/// A file's text as a source that lives as long as the embedded ones.
fn leaked(path: &Path) -> KernelSource {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| common::usage(&format!("{}: {e}", path.display())));
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    KernelSource { name: Box::leak(name.into_boxed_str()), src: Box::leak(src.into_boxed_str()) }
}

/// One line for `k`: its result for every target; whether it passed.
fn check(
    k: &KernelSource,
    headers: &[KernelSource],
    targets: &[Target],
    extra: &[String],
    dump: Option<&Path>,
) -> bool {
    let (mut parts, mut logs, mut ok) = (Vec::new(), Vec::new(), true);
    for t in targets {
        let arch = t.option().trim_start_matches("--gpu-architecture=").to_string();
        let compiled = nvrtc::compile_with(k, headers, t, extra);
        if let (Some(dir), Ok(c)) = (dump, &compiled) {
            let path = dir.join(format!("{}.{arch}", k.name));
            std::fs::write(&path, &c.image).unwrap_or_else(|e| common::usage(&format!("{}: {e}", path.display())));
        }
        match compiled {
            Ok(c) if c.log.is_empty() => parts.push(format!("{arch} {} bytes {:.0} ms", c.image.len(), c.compile_ms)),
            Ok(c) => {
                ok = false;
                parts.push(format!("{arch} WARNINGS"));
                logs.push(c.log);
            }
            Err(e) => {
                ok = false;
                parts.push(format!("{arch} ERROR"));
                logs.push(e.to_string());
            }
        }
    }
    println!("{} {} ({})", if ok { "ok   " } else { "FAIL " }, k.name, parts.join("; "));
    for line in logs.iter().flat_map(|l| l.lines()) {
        println!("      {line}");
    }
    ok
}

/// Compiles `k` on a thread of its own that blocks every signal (as the
/// extension's GPU threads do), calling `poll` on this thread every `every`
/// until the compile is done.
fn compile_beside(
    k: &KernelSource,
    headers: &[KernelSource],
    target: &Target,
    extra: &[String],
    every: std::time::Duration,
    mut poll: impl FnMut(),
) -> Result<nvrtc::Compiled, gpu_graph_gpu::GpuError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            // SAFETY: blocks every signal in this thread only.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
            let r = nvrtc::compile_with(k, headers, target, extra);
            done.store(true, Ordering::SeqCst);
            r
        });
        while !done.load(Ordering::SeqCst) {
            poll();
            std::thread::sleep(every);
        }
        t.join().expect("the compile's thread")
    })
}

/// Which signals' actions a compile of `k` changes while it runs on a thread
/// of its own (every signal blocked there, as the extension's GPU threads
/// do), polled every 50 us from this thread; true when they are all in
/// `nvrtc_signals::SIGNALS_TAKEN`, which the extension holds back meanwhile.
fn check_signals(k: &KernelSource, headers: &[KernelSource], target: &Target, extra: &[String]) -> bool {
    extern "C" fn noted(_: libc::c_int) {}
    // the asynchronous signals (a fault's stay as they are)
    let sigs: Vec<libc::c_int> = (1..32)
        .filter(|s| {
            ![libc::SIGKILL, libc::SIGSTOP, libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP]
                .contains(s)
        })
        .collect();
    let handler = noted as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: this program's own actions, put back below.
    let old: Vec<libc::sigaction> = sigs
        .iter()
        .map(|&s| unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            a.sa_sigaction = handler;
            let mut o: libc::sigaction = std::mem::zeroed();
            libc::sigaction(s, &a, &mut o);
            o
        })
        .collect();
    let mut taken = std::collections::BTreeSet::new();
    let compiled = compile_beside(k, headers, target, extra, std::time::Duration::from_micros(50), || {
        for &s in &sigs {
            // SAFETY: reads an action.
            let now = unsafe {
                let mut a: libc::sigaction = std::mem::zeroed();
                libc::sigaction(s, std::ptr::null(), &mut a);
                a.sa_sigaction
            };
            if now != handler {
                taken.insert(s);
            }
        }
    });
    for (&s, o) in sigs.iter().zip(&old) {
        // SAFETY: puts this program's action back.
        unsafe { libc::sigaction(s, o, std::ptr::null_mut()) };
    }
    let outside: Vec<_> = taken.iter().filter(|s| !nvrtc_signals::SIGNALS_TAKEN.contains(s)).collect();
    let ok = compiled.is_ok() && outside.is_empty();
    println!(
        "{} signals a compile of {} takes over: {:?} (held back by the extension: {:?}){}",
        if ok { "ok   " } else { "FAIL " },
        k.name,
        taken,
        nvrtc_signals::SIGNALS_TAKEN,
        compiled.err().map(|e| format!("; the compile failed: {e}")).unwrap_or_default()
    );
    ok
}

/// A child of [`check_shield`]: the first compile of this process, of `k`,
/// on a thread blocking every signal, while SIGINT has a handler of this
/// program's (as a backend's cancel has PostgreSQL's) and, but `bare`, an
/// NvrtcShield is up. `shielded` and `bare`: once NVRTC's own handler is
/// seen in place of that one, SIGINT is sent to the process. `pending`:
/// SIGINT is sent before the compile starts and served after it ends (a
/// cancel that came while the backend was busy elsewhere, left to its next
/// check). Exits 0 when this program's handler ran once, 3 when NVRTC's
/// handler was never seen (nothing shown), 5 when the signal was lost;
/// NVRTC's handler itself ends the process with 4.
fn signal_child(mode: &str, k: &KernelSource, headers: &[KernelSource], target: &Target, extra: &[String]) -> ! {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static RAN: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn mine(_: libc::c_int) {
        RAN.fetch_add(1, Ordering::SeqCst);
    }
    let handler = mine as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: this program's own action for SIGINT.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = handler;
        libc::sigaction(libc::SIGINT, &a, std::ptr::null_mut());
    }
    let shield = (mode != "bare").then(nvrtc_signals::NvrtcShield::new);
    let mut sent = mode == "pending";
    if sent {
        // SAFETY: sends SIGINT to this process.
        unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
    }
    let _ = compile_beside(k, headers, target, extra, std::time::Duration::from_micros(20), || {
        // SAFETY: reads SIGINT's action; sends SIGINT to this process.
        unsafe {
            let mut a: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &mut a);
            if a.sa_sigaction != handler && !sent {
                libc::kill(libc::getpid(), libc::SIGINT);
                sent = true;
            }
        }
    });
    nvrtc_signals::serve_shielded();
    drop(shield);
    std::process::exit(if !sent {
        3
    } else if RAN.load(Ordering::SeqCst) == 1 {
        0
    } else {
        5
    })
}

/// A SIGINT (a cancel) in the window of a process's first compile: with
/// the shield it reaches the program's own handler (exit 0), without it
/// NVRTC's handler ends the process (exit 4; the GPU machine's SIGSEGV of
/// cancelled builds). And a SIGINT that arrived under the shield before the
/// compile and is served after it reaches the handler too (exit 0): NVRTC
/// sets SIGINT to SIG_IGN for a moment, which discards a pending one (a
/// cancel lost on the GPU machine before the shield's taker). Each in a
/// child process of this program, the first compile of each; passes when
/// all three happen, or when this NVRTC no longer takes SIGINT (3, 3, 0).
fn check_shield() -> bool {
    let exe = std::env::current_exe().expect("current exe");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let status = |mode: &str| {
        std::process::Command::new(&exe)
            .args(&args)
            .arg(format!("--signal-child={mode}"))
            .stdout(std::process::Stdio::null())
            .status()
            .map(|s| s.code().unwrap_or(-1))
            .unwrap_or(-1)
    };
    let (shielded, bare, pending) = (status("shielded"), status("bare"), status("pending"));
    let ok = ((shielded == 0 && bare == 4) || (shielded == 3 && bare == 3)) && pending == 0;
    println!(
        "{} a SIGINT in the window of a first compile: shielded, exit {shielded} (0: served to the program's handler); bare, exit {bare} (4: NVRTC's handler ended the process); held from before the compile, exit {pending} (0: served, 5: lost)",
        if ok { "ok   " } else { "FAIL " }
    );
    ok
}

fn main() {
    let o = Opts::parse();
    let targets: Vec<Target> = o.arch.iter().map(|a| parse_target(a)).collect();
    let mut extra: Vec<String> = o.include.iter().map(|d| format!("-I{d}")).collect();
    extra.extend(o.option.iter().cloned());
    let (mut sources, headers): (Vec<KernelSource>, Vec<KernelSource>) = if o.files.is_empty() {
        (nvrtc::ALL.to_vec(), nvrtc::HEADERS.to_vec())
    } else {
        let dir = o.files[0].parent().unwrap_or(Path::new("."));
        let headers = nvrtc::HEADERS.iter().map(|h| leaked(&dir.join(h.name))).collect();
        (o.files.iter().map(|f| leaked(f)).collect(), headers)
    };
    // the ABI check: static_asserts generated from abi.rs over abi.h
    let asserts = abi::static_asserts();
    sources.push(KernelSource { name: "abi_check.cu", src: Box::leak(asserts.into_boxed_str()) });
    match nvrtc::version() {
        Ok((a, b)) => {
            eprintln!("NVRTC {a}.{b} ({})", gpu_graph_gpu::loader::load_nvrtc().unwrap_or_default().display())
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
    if let Some(mode) = &o.signal_child {
        signal_child(mode, &sources[0], &headers, &targets[0], &extra);
    }
    // first: NVRTC takes the signals over at its first compile in a process
    let signals_ok = check_signals(&sources[0], &headers, &targets[0], &extra) && check_shield();
    let mut failed = sources.iter().filter(|k| !check(k, &headers, &targets, &extra, o.dump_dir.as_deref())).count();
    if !signals_ok {
        failed += 1;
    }
    if failed > 0 {
        eprintln!("{failed} kernel file(s) failed (warnings count as errors)");
        std::process::exit(1);
    }
}
