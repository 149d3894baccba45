//! Compiles every kernel of `kernels/` with NVRTC, through the same compile
//! function the extension uses, and fails on any error or warning.
//!
//! usage: gpu-graph-nvrtc-check [--arch compute_90|sm_90]... [-I DIR]... [FILE.cu ...]
//!
//! Without files it checks the kernels embedded in the binary. With files it
//! checks those (the embedded copies are what ships; files let a script
//! check the working tree without rebuilding). One line per kernel and
//! target; exit status 1 if any failed or warned.

use gpu_graph_gpu::nvrtc::{self, KernelSource, Target};

fn parse_target(s: &str) -> Option<Target> {
    let (kind, num) = s.split_once('_')?;
    let a: u32 = num.parse().ok()?;
    match kind {
        "compute" => Some(Target::Ptx(a)),
        "sm" => Some(Target::Cubin(a)),
        _ => None,
    }
}

fn main() {
    let mut targets = Vec::new();
    let mut extra = Vec::new();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--arch" => {
                let v = args.next().unwrap_or_default();
                match parse_target(&v) {
                    Some(t) => targets.push(t),
                    None => {
                        eprintln!("bad --arch {v:?} (compute_90, sm_90, ...)");
                        std::process::exit(2);
                    }
                }
            }
            "-I" => extra.push(format!("-I{}", args.next().unwrap_or_default())),
            s if s.starts_with("-I") => extra.push(s.to_string()),
            "-h" | "--help" => {
                eprintln!("usage: gpu-graph-nvrtc-check [--arch compute_90|sm_90]... [-I DIR]... [FILE.cu ...]");
                return;
            }
            _ => files.push(a),
        }
    }
    if targets.is_empty() {
        targets.push(Target::Ptx(90));
    }
    // sources: leaked so they live as long as the embedded ones
    let sources: Vec<KernelSource> = if files.is_empty() {
        nvrtc::ALL.to_vec()
    } else {
        files
            .iter()
            .map(|f| {
                let src = std::fs::read_to_string(f).unwrap_or_else(|e| {
                    eprintln!("{f}: {e}");
                    std::process::exit(2)
                });
                let name = std::path::Path::new(f).file_name().unwrap().to_string_lossy().into_owned();
                KernelSource { name: Box::leak(name.into_boxed_str()), src: Box::leak(src.into_boxed_str()) }
            })
            .collect()
    };
    match nvrtc::version() {
        Ok((a, b)) => eprintln!("NVRTC {a}.{b} ({})", gpu_graph_gpu::loader::load_nvrtc().unwrap().display()),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
    // one line per kernel file: every target's result on it
    let mut failed = 0;
    for k in &sources {
        let mut parts = Vec::new();
        let mut logs = Vec::new();
        let mut bad = false;
        for t in &targets {
            let arch = t.option().trim_start_matches("--gpu-architecture=").to_string();
            match nvrtc::compile(k, t, &extra) {
                Ok(c) if c.log.is_empty() => {
                    parts.push(format!("{arch} {} bytes {:.0} ms", c.image.len(), c.compile_ms))
                }
                Ok(c) => {
                    bad = true;
                    parts.push(format!("{arch} WARNINGS"));
                    logs.push(c.log);
                }
                Err(e) => {
                    bad = true;
                    parts.push(format!("{arch} ERROR"));
                    logs.push(e.to_string());
                }
            }
        }
        println!("{} {} ({})", if bad { "FAIL " } else { "ok   " }, k.name, parts.join("; "));
        for l in logs {
            for line in l.lines() {
                println!("      {line}");
            }
        }
        failed += bad as usize;
    }
    if failed > 0 {
        eprintln!("{failed} kernel file(s) failed (warnings count as errors)");
        std::process::exit(1);
    }
}
