//! A fault injected into the kernel: every call then fails with Poisoned,
//! everything drops without hanging, and a new process serves again.

use std::time::{Duration, Instant};

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::mean_recall;
use gpu_graph_gpu::search::{SearchError, SearchServer, ServerConfig};
use gpu_graph_gpu::{build, Gpu, KnnInit};

use crate::common::{DataArgs, Verdict, K};
use crate::WAIT;

pub fn test(gpu: Gpu, ix: &FlatIndex, queries: &[Vec<f32>], data: &DataArgs, v: &mut Verdict) {
    let cfg = ServerConfig { allow_fault_injection: true, ..ServerConfig::default() };
    let server = match SearchServer::start(&gpu, cfg) {
        Ok(s) => s,
        Err(e) => {
            v.check(false, format!("fault test: start: {e}"));
            return;
        }
    };
    let id = server.load(ix).expect("load");
    let mut first = server.submit(id, &queries[0], K, 40).expect("submit");
    let _ = server.wait(&mut first, WAIT);
    let pending: Vec<_> = queries.iter().take(8).filter_map(|q| server.submit(id, q, K, 40).ok()).collect();
    let t = Instant::now();
    let inj = server.inject_fault();
    // the fault is asynchronous: queries may still be answered for a moment;
    // within 3 s one must fail with Poisoned
    let ask = |q: &[f32]| {
        server.submit(id, q, K, 40).and_then(|mut t| server.wait(&mut t, Duration::from_secs(3)).map(|_| ()))
    };
    let (mut after, mut answered_after) = (Ok(()), 0);
    while t.elapsed() < Duration::from_secs(3) {
        after = ask(&queries[1]);
        if after.is_err() {
            break;
        }
        answered_after += 1;
    }
    let detect_ms = t.elapsed().as_secs_f64() * 1e3;
    let later = ask(&queries[2]);
    let load_after = server.load(ix);
    let poisoned = |r: &Result<(), SearchError>| matches!(r, Err(SearchError::Poisoned(_)));
    v.check(
        inj.is_ok() && poisoned(&after) && poisoned(&later) && load_after.is_err() && server.poisoned().is_some(),
        format!(
            "fault injected: detected in {detect_ms:.1} ms ({answered_after} answered before): {:?}; next submit {:?}; load {:?}",
            after.as_ref().err(),
            later.as_ref().err().map(|e| e.to_string()),
            load_after.err().map(|e| e.to_string())
        ),
    );
    // the process cannot use CUDA any more (a kernel fault is sticky for
    // the process): everything must still drop without hanging, and a new
    // process must serve again
    let t = Instant::now();
    drop(pending);
    let sd = server.shutdown();
    let broken = server.context_broken();
    drop(server);
    drop(gpu);
    let drop_ms = t.elapsed().as_secs_f64() * 1e3;
    let reopen = Gpu::open().err().map(|e| e.to_string());
    let (child_ok, child_text, child_ms) = run_child(data);
    v.check(
        sd.is_ok() && broken && child_ok,
        format!(
            "after the fault: shutdown {sd:?}, context broken {broken}, server and Gpu dropped in {drop_ms:.1} ms; Gpu::open in this process: {reopen:?}; a new process ({child_ms:.0} ms): {child_text}"
        ),
    );
}

/// This program again, as the process after the fault.
fn run_child(data: &DataArgs) -> (bool, String, f64) {
    let t = Instant::now();
    let me = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(me)
        .arg("--child-after-fault")
        .arg("--base")
        .arg(&data.base)
        .arg("--query")
        .arg(&data.query)
        .args(["--rows", "20000"])
        .output();
    let (ok, text) = match out {
        Ok(o) => (o.status.success(), String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Err(e) => (false, e.to_string()),
    };
    (ok, text, t.elapsed().as_secs_f64() * 1e3)
}

/// The process started after a fault: a fresh GPU, server and index (a
/// prefix of the data, brute-force ground truth) answer queries. Prints one
/// line; exit status 0 when recall@10 at ef 40 is above 0.9.
pub fn child(data: &DataArgs) -> i32 {
    let d = DataArgs { gt: None, ..data.clone() }.load(Metric::L2);
    let r = (|| -> Result<f64, String> {
        let gpu = Gpu::open().map_err(|e| format!("Gpu::open: {e}"))?;
        let (g, _) = build(&gpu, &d.base.data, d.base.dim, &BuildParams::default(), KnnInit::Auto, &|| false)
            .map_err(|e| format!("build: {e}"))?;
        let server = SearchServer::start(&gpu, ServerConfig::default()).map_err(|e| format!("start: {e}"))?;
        let id = server
            .load(&FlatIndex::new(Metric::L2, d.base.dim, d.base.data.clone(), g))
            .map_err(|e| format!("load: {e}"))?;
        let mut found = Vec::new();
        for q in 0..d.queries.len() {
            let a = server
                .submit(id, d.queries.row(q), K, 40)
                .and_then(|mut t| server.wait(&mut t, WAIT))
                .map_err(|e| format!("query {q}: {e}"))?;
            found.push(a.hits.iter().map(|x| Metric::L2.to_sql(x.0)).collect::<Vec<_>>());
        }
        server.shutdown().map_err(|e| format!("shutdown: {e}"))?;
        Ok(mean_recall(&found, &d.truth, K))
    })();
    match r {
        Ok(rc) => {
            println!(
                "GPU opened, graph built, server started, {} queries answered, recall@10 {rc:.4}",
                d.queries.len()
            );
            i32::from(rc <= 0.9)
        }
        Err(e) => {
            println!("{e}");
            1
        }
    }
}
