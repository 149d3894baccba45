//! The device test of the persistent search kernel (crates/gpu/src/search),
//! run on the GPU machine:
//!
//! 1. opens the GPU, reads a data set, builds its graph on the GPU (GRNND)
//!    and a second, inner-product index of a prefix;
//! 2. recall@10 of the CPU search (engine::search) at each ef;
//! 3. starts the SearchServer, loads both indexes, answers every query once
//!    per ef and checks each answer (sorted, distinct, ids in range,
//!    distances recomputed on the host) and recall against the CPU's at the
//!    same ef (more than 0.01 below fails);
//! 4. with 1, 16, 64 submitter threads: queries/s, p50/p99 latency (submit
//!    to answer) and recall@10 at each ef;
//! 5. deletes (never returned after update_flags), both indexes at once,
//!    unload, Busy, abandoned tickets, shutdown (memory freed), and a fault
//!    injected into the kernel: every call errs, then a new Gpu and server
//!    work again.
//!
//! `--sim` runs only the CPU model of the kernel (no GPU needed): recall and
//! work of search plans against the CPU search, on a graph built on the CPU.
//!
//! Exits 1 on a recall gap or any error, 2 on a usage or I/O error.
//!
//! usage: gpu-graph-searchcheck --base FILE [--rows N] --query FILE [--gt FILE]
//!        [--degree 32] [--efs 10,20,40,64,100] [--threads 1,16,64] [--secs 1.5]
//!        [--ctas N] [--slots N] [--policy key=val,...] [--variant key=val,...]...
//!        [--variant-threads 64] [--ip-rows 20000] [--no-extra] [--no-fault] [--sim]
//! policy/variant keys: ctas (per slot), per (list per CTA), seeds, beam,
//! offset, capf, cape.

use std::path::Path;
use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_graph_engine::dataset::{self, read_ivecs, Matrix};
use gpu_graph_engine::distance::{dot, l2sq};
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::memory::MemoryStore;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::{exact_knn, mean_recall, truth_from_ids};
use gpu_graph_engine::rnn_descent;
use gpu_graph_engine::search::search;
use gpu_graph_gpu::search::sim::{simulate, SimIndex};
use gpu_graph_gpu::search::{
    IndexImage, QueryPlan, ResidentId, SearchError, SearchPolicy, SearchServer, ServerConfig, FLAG_DELETED,
};
use gpu_graph_gpu::{build, Gpu, KnnInit};
use rayon::prelude::*;

const K: usize = 10;
const WAIT: Duration = Duration::from_secs(5);

fn usage(msg: &str) -> ! {
    eprintln!("{msg}\nusage: see the top of crates/gpu/src/bin/gpu-graph-searchcheck.rs");
    exit(2)
}

fn read_vectors(path: &str, rows: Option<usize>) -> Matrix<f32> {
    dataset::read_vectors(Path::new(path), rows).unwrap_or_else(|e| usage(&e.to_string()))
}

fn list(s: &str) -> Vec<usize> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().unwrap_or_else(|_| usage(&format!("bad number {x:?}"))))
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Pol {
    ctas: usize,
    policy: SearchPolicy,
}

fn apply(p: &mut Pol, spec: &str) {
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or_else(|| usage(&format!("bad item {kv:?}")));
        let n: usize = v.parse().unwrap_or_else(|_| usage(&format!("bad number in {kv:?}")));
        match k {
            "ctas" => p.ctas = n,
            "per" => p.policy.list_per_cta = n,
            "seeds" => p.policy.seeds = n,
            "beam" => p.policy.beam_width = n,
            "offset" => p.policy.offset_beam = n,
            "capf" => p.policy.cap_factor = n,
            "cape" => p.policy.cap_extra = n,
            _ => usage(&format!("unknown key {k:?}")),
        }
    }
}

fn truth_of(base: &Matrix<f32>, queries: &Matrix<f32>, gt: Option<&str>, metric: Metric) -> Vec<Vec<(u32, f64)>> {
    match gt {
        Some(p) => {
            let gt = read_ivecs(Path::new(p), Some(queries.len())).unwrap_or_else(|e| usage(&format!("{p}: {e}")));
            truth_from_ids(base, queries, &gt, K, metric)
        }
        None => exact_knn(&base.data, base.dim, &queries.data, K, metric),
    }
}

fn cpu_recall(
    store: &MemoryStore,
    metric: Metric,
    queries: &Matrix<f32>,
    truth: &[Vec<(u32, f64)>],
    ef: usize,
) -> (f64, f64) {
    let t = Instant::now();
    let found: Vec<Vec<f64>> = (0..queries.len())
        .into_par_iter()
        .map(|q| search(store, metric, queries.row(q), K, ef).iter().map(|h| metric.to_sql(h.dist)).collect())
        .collect();
    let qps = queries.len() as f64 / t.elapsed().as_secs_f64();
    (mean_recall(&found, truth, K), qps)
}

fn store_of(g: &Graph, stored: &[f32], sdim: usize) -> MemoryStore {
    let n = stored.len() / sdim;
    MemoryStore::from_graph(g, stored.to_vec(), sdim, (0..n as u64).collect())
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i] as f64 / 1e3
}

/// Checks one answer; returns an error text or None.
#[allow(clippy::too_many_arguments)]
fn check_answer(
    hits: &[(f32, u32)],
    n: usize,
    k: usize,
    q: &[f32],
    stored: &[f32],
    sdim: usize,
    ip: bool,
    deleted: Option<&[bool]>,
) -> Option<String> {
    if hits.len() > k || hits.is_empty() {
        return Some(format!("{} hits for k {k}", hits.len()));
    }
    for w in hits.windows(2) {
        if w[0].0 > w[1].0 {
            return Some(format!("not sorted: {:?} then {:?}", w[0], w[1]));
        }
    }
    let mut ids: Vec<u32> = hits.iter().map(|h| h.1).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Some("a node twice".into());
    }
    for &(d, v) in hits {
        if v as usize >= n {
            return Some(format!("node {v} of {n}"));
        }
        if deleted.is_some_and(|del| del[v as usize]) {
            return Some(format!("deleted node {v} returned"));
        }
        let x = &stored[v as usize * sdim..(v as usize + 1) * sdim];
        let e = if ip { -dot(&q[..sdim - 1], &x[..sdim - 1]) } else { l2sq(q, x) };
        if (e - d).abs() > 1e-4 * e.abs().max(1.0) {
            return Some(format!("node {v}: distance {d}, host says {e}"));
        }
    }
    None
}

struct Run {
    qps: f64,
    p50: f64,
    p99: f64,
    recall: f64,
    errors: usize,
    first_error: Option<String>,
    answered: usize,
    computed: f64,
    expanded: f64,
    capped: usize,
}

/// `threads` submitters, each submit -> wait in a loop for `secs` (and at
/// least until every query was answered once).
#[allow(clippy::too_many_arguments)]
fn throughput(
    server: &SearchServer,
    id: ResidentId,
    queries: &[Vec<f32>],
    truth: &[Vec<(u32, f64)>],
    metric: Metric,
    plan: &QueryPlan,
    threads: usize,
    secs: f64,
) -> Run {
    let nq = queries.len();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first: Mutex<Vec<Option<Vec<f64>>>> = Mutex::new(vec![None; nq]);
    let lat: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let errs = AtomicUsize::new(0);
    let first_err: Mutex<Option<String>> = Mutex::new(None);
    let work = Mutex::new((0u64, 0u64, 0usize));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut my_lat = Vec::with_capacity(1 << 16);
                let mut my_first = Vec::new();
                let (mut comp, mut exp, mut cap) = (0u64, 0u64, 0usize);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= nq && stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let qi = i % nq;
                    let t = Instant::now();
                    let r = server
                        .submit_plan(id, &queries[qi], K, plan)
                        .and_then(|mut tk| server.wait_answer(&mut tk, WAIT));
                    match r {
                        Ok(a) => {
                            my_lat.push(t.elapsed().as_nanos() as u64);
                            comp += a.computed as u64;
                            exp += a.expanded as u64;
                            cap += (a.capped > 0) as usize;
                            if i < nq {
                                my_first.push((qi, a.hits.iter().map(|h| metric.to_sql(h.0)).collect::<Vec<f64>>()));
                            }
                        }
                        Err(e) => {
                            errs.fetch_add(1, Ordering::Relaxed);
                            first_err.lock().unwrap().get_or_insert_with(|| e.to_string());
                            if matches!(e, SearchError::Poisoned(_) | SearchError::Closed) {
                                stop.store(true, Ordering::Relaxed);
                                break;
                            }
                        }
                    }
                    if t0.elapsed().as_secs_f64() >= secs {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                lat.lock().unwrap().extend(my_lat);
                let mut f = first.lock().unwrap();
                for (qi, d) in my_first {
                    f[qi] = Some(d);
                }
                let mut w = work.lock().unwrap();
                w.0 += comp;
                w.1 += exp;
                w.2 += cap;
            });
        }
    });
    let el = t0.elapsed().as_secs_f64();
    let mut lat = lat.into_inner().unwrap();
    let answered = lat.len();
    let found: Vec<Vec<f64>> = first.into_inner().unwrap().into_iter().map(|o| o.unwrap_or_default()).collect();
    let w = work.into_inner().unwrap();
    Run {
        qps: answered as f64 / el,
        p50: pct(&mut lat, 0.5),
        p99: pct(&mut lat, 0.99),
        recall: mean_recall(&found, truth, K),
        errors: errs.into_inner(),
        first_error: first_err.into_inner().unwrap(),
        answered,
        computed: w.0 as f64 / answered.max(1) as f64,
        expanded: w.1 as f64 / answered.max(1) as f64,
        capped: w.2,
    }
}

fn main() {
    let mut base_path = None;
    let mut query_path = None;
    let mut gt_path = None;
    let mut rows = None;
    let mut params = BuildParams::default();
    let mut efs = vec![10, 20, 40, 64, 100];
    let mut threads = vec![1, 16, 64];
    let mut secs = 1.5;
    let mut pol = Pol { ctas: 0, policy: SearchPolicy::default() };
    let mut slots = 0;
    let mut variants: Vec<String> = Vec::new();
    let mut ip_rows = 20_000;
    let mut extra = true;
    let mut fault = true;
    let mut sim = false;
    let mut child = false;
    let mut variant_threads: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    let next = |a: &str, it: &mut dyn Iterator<Item = String>| {
        it.next().unwrap_or_else(|| usage(&format!("{a} needs a value")))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--base" => base_path = Some(next(&a, &mut args)),
            "--query" => query_path = Some(next(&a, &mut args)),
            "--gt" => gt_path = Some(next(&a, &mut args)),
            "--rows" => rows = Some(list(&next(&a, &mut args))[0]),
            "--degree" => params.degree = list(&next(&a, &mut args))[0],
            "--efs" => efs = list(&next(&a, &mut args)),
            "--threads" => threads = list(&next(&a, &mut args)),
            "--secs" => secs = next(&a, &mut args).parse().unwrap_or_else(|_| usage("--secs")),
            "--ctas" => pol.ctas = list(&next(&a, &mut args))[0],
            "--slots" => slots = list(&next(&a, &mut args))[0],
            "--policy" => apply(&mut pol, &next(&a, &mut args)),
            "--variant" => variants.push(next(&a, &mut args)),
            "--ip-rows" => ip_rows = list(&next(&a, &mut args))[0],
            "--no-extra" => extra = false,
            "--no-fault" => fault = false,
            "--sim" => sim = true,
            "--child-after-fault" => child = true,
            "--variant-threads" => variant_threads = list(&next(&a, &mut args)),
            _ => usage(&format!("unknown argument {a}")),
        }
    }
    if child {
        exit(child_after_fault(base_path.as_deref(), query_path.as_deref(), rows));
    }
    if variant_threads.is_empty() {
        variant_threads = vec![*threads.last().unwrap_or(&64)];
    }
    let base_path = base_path.unwrap_or_else(|| usage("--base is required"));
    let query_path = query_path.unwrap_or_else(|| usage("--query is required"));
    let t = Instant::now();
    let base = read_vectors(&base_path, rows);
    let queries = read_vectors(&query_path, None);
    if queries.dim != base.dim {
        usage("query and base dimensions differ");
    }
    let truth = truth_of(&base, &queries, gt_path.as_deref(), Metric::L2);
    println!(
        "data: {} rows x {} dims, {} queries, ground truth {} ({:.1} s)",
        base.len(),
        base.dim,
        queries.len(),
        gt_path.as_deref().unwrap_or("by brute force"),
        t.elapsed().as_secs_f64()
    );
    if sim {
        run_sim(&base, &queries, &truth, &params, &efs, pol, &variants);
        return;
    }
    let mut failed = false;

    // the GPU and the graphs (all built before the server starts: see
    // SearchServer::start on lazy module loading)
    let gpu = Gpu::open().unwrap_or_else(|e| {
        println!("FAIL  Gpu::open: {e}");
        exit(1)
    });
    let i = gpu.info();
    println!(
        "device {} (cc {}.{}, {} SMs, {} MiB), driver {}, NVRTC {}.{} ({:?})",
        i.name,
        i.cc.0,
        i.cc.1,
        i.sm_count,
        i.total_mem >> 20,
        i.driver_version,
        i.nvrtc_version.0,
        i.nvrtc_version.1,
        i.target
    );
    let t = Instant::now();
    let (g, pt) = build(&gpu, &base.data, base.dim, &params, KnnInit::Auto, &|| false).unwrap_or_else(|e| {
        println!("FAIL  GPU build: {e}");
        exit(1)
    });
    println!(
        "graph: GRNND on the GPU, degree {}, {:.0} ms (wall {:.0} ms), entry {:?}",
        g.degree,
        pt.total_ms(),
        t.elapsed().as_secs_f64() * 1e3,
        g.entry
    );
    // the inner-product index: a prefix, MIPS-augmented
    let ipn = ip_rows.min(base.len());
    let ip_base = Matrix { dim: base.dim, data: base.data[..ipn * base.dim].to_vec() };
    let max_norm = ip_base.data.chunks(base.dim).map(|r| dot(r, r).sqrt()).fold(0f32, f32::max);
    let mut ip_stored = Vec::with_capacity(ipn * (base.dim + 1));
    for r in ip_base.data.chunks(base.dim) {
        Metric::InnerProduct.prepare_stored(r, max_norm, &mut ip_stored);
    }
    let ip_dim = base.dim + 1;
    let (ip_g, _) = build(&gpu, &ip_stored, ip_dim, &params, KnnInit::Auto, &|| false).unwrap_or_else(|e| {
        println!("FAIL  GPU build (inner product): {e}");
        exit(1)
    });
    let ip_truth = exact_knn(&ip_base.data, base.dim, &queries.data, K, Metric::InnerProduct);
    let ip_queries: Vec<Vec<f32>> =
        (0..queries.len()).map(|q| Metric::InnerProduct.prepare_query(queries.row(q))).collect();
    let l2_queries: Vec<Vec<f32>> = (0..queries.len()).map(|q| Metric::L2.prepare_query(queries.row(q))).collect();

    // the CPU's recall
    let mut cpu = Vec::new();
    let store = store_of(&g, &base.data, base.dim);
    for &ef in &efs {
        let (r, qps) = cpu_recall(&store, Metric::L2, &queries, &truth, ef);
        println!("cpu   ef {ef:>4}: recall@10 {r:.4} ({qps:.0} queries/s on {} threads)", rayon::current_num_threads());
        cpu.push(r);
    }

    // the server
    let free0 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    let cfg = ServerConfig { slots, ctas_per_slot: pol.ctas, policy: pol.policy, ..ServerConfig::default() };
    let t = Instant::now();
    let server = SearchServer::start(&gpu, cfg.clone()).unwrap_or_else(|e| {
        println!("FAIL  SearchServer::start: {e}");
        exit(1)
    });
    let si = server.info().clone();
    println!(
        "server: started in {:.0} ms (compile+load {:.0} ms): {} slots x {} CTAs ({} blocks/SM x {} SMs resident, {} B shared each), {} groups, visited 2^{} per slot, stream mem ops {}, {} MiB device, {} MiB pinned",
        t.elapsed().as_secs_f64() * 1e3,
        si.compile_ms,
        si.slots,
        si.ctas_per_slot,
        si.blocks_per_sm,
        si.sm_count,
        si.shared_bytes,
        si.groups,
        si.visited_log2,
        si.stream_mem_ops,
        si.device_bytes >> 20,
        si.pinned_bytes >> 20
    );
    let t = Instant::now();
    let image = IndexImage {
        vectors: &base.data,
        stored_dim: base.dim,
        adjacency: &g.adjacency,
        degree: g.degree,
        entry: g.entry.unwrap_or(0),
        flags: None,
        metric: Metric::L2,
    };
    let id = server.load(&image).unwrap_or_else(|e| {
        println!("FAIL  load: {e}");
        exit(1)
    });
    let ri = server.resident_info(id).unwrap();
    println!(
        "load: {} rows in {:.0} ms, {} MiB on the device, fp16 {}",
        ri.n,
        t.elapsed().as_secs_f64() * 1e3,
        ri.bytes >> 20,
        ri.half
    );
    let ip_image = IndexImage {
        vectors: &ip_stored,
        stored_dim: ip_dim,
        adjacency: &ip_g.adjacency,
        degree: ip_g.degree,
        entry: ip_g.entry.unwrap_or(0),
        flags: None,
        metric: Metric::InnerProduct,
    };
    let ip_id = server.load(&ip_image).unwrap_or_else(|e| {
        println!("FAIL  load (inner product): {e}");
        exit(1)
    });

    // every query once per ef, checked
    println!("check: every query once per ef, one thread; answers verified on the host");
    for (ei, &ef) in efs.iter().enumerate() {
        let plan = server.plan(K, ef);
        let mut found = Vec::new();
        let mut bad = 0;
        let mut first_bad = None;
        let t = Instant::now();
        let (mut comp, mut exp) = (0u64, 0u64);
        for (qi, q) in l2_queries.iter().enumerate() {
            match server.submit(id, q, K, ef).and_then(|mut tk| server.wait_answer(&mut tk, WAIT)) {
                Ok(a) => {
                    if let Some(e) = check_answer(&a.hits, base.len(), K, q, &base.data, base.dim, false, None) {
                        bad += 1;
                        first_bad.get_or_insert(format!("query {qi}: {e}"));
                    }
                    comp += a.computed as u64;
                    exp += a.expanded as u64;
                    found.push(a.hits.iter().map(|h| Metric::L2.to_sql(h.0)).collect::<Vec<_>>());
                }
                Err(e) => {
                    bad += 1;
                    first_bad.get_or_insert(format!("query {qi}: {e}"));
                    found.push(Vec::new());
                }
            }
        }
        let r = mean_recall(&found, &truth, K);
        let nq = queries.len() as f64;
        let ok = bad == 0 && r >= cpu[ei] - 0.01;
        println!(
            "{} gpu   ef {ef:>4}: recall@10 {r:.4} (cpu {:.4}), plan {}x{} (beam {} from {}, seeds {}, cap {}), {:.0} distances, {:.0} expansions per query, {:.1} us per query sequential{}",
            if ok { "ok  " } else { "FAIL" },
            cpu[ei],
            plan.ctas,
            plan.list,
            plan.beam_width,
            plan.offset_beam,
            plan.seeds,
            plan.max_expand,
            comp as f64 / nq,
            exp as f64 / nq,
            t.elapsed().as_secs_f64() * 1e6 / nq,
            first_bad.map(|e| format!("; {bad} bad, first: {e}")).unwrap_or_default()
        );
        failed |= !ok;
        if bad > 0 {
            println!("RESULT: FAIL (stopping at the first bad answer)");
            exit(1);
        }
    }

    // throughput
    println!("throughput ({secs} s per run, k {K}; latency = submit to answer):");
    let mut pols = vec![("default".to_string(), pol)];
    for v in &variants {
        let mut p = pol;
        apply(&mut p, v);
        pols.push((v.clone(), p));
    }
    for (label, p) in &pols {
        let ctas = if p.ctas == 0 { si.ctas_per_slot } else { p.ctas.min(si.ctas_per_slot) };
        let ths: &[usize] = if label == "default" { &threads } else { &variant_threads };
        for &th in ths {
            for (ei, &ef) in efs.iter().enumerate() {
                let plan = p.policy.plan(K, ef, ctas);
                let r = throughput(&server, id, &l2_queries, &truth, Metric::L2, &plan, th, secs);
                let ok = r.errors == 0 && r.recall >= cpu[ei] - 0.01;
                println!(
                    "{} {label:<10} threads {th:>3} ef {ef:>4} plan {}x{:<3}: {:>8.0} queries/s  p50 {:>7.1} us  p99 {:>7.1} us  recall@10 {:.4} (cpu {:.4})  {:.0} dist/q {:.0} exp/q, capped {}{}",
                    if ok { "ok  " } else { "FAIL" },
                    plan.ctas,
                    plan.list,
                    r.qps,
                    r.p50,
                    r.p99,
                    r.recall,
                    cpu[ei],
                    r.computed,
                    r.expanded,
                    r.capped,
                    if r.errors > 0 {
                        format!("; {} errors of {}, first: {}", r.errors, r.answered + r.errors, r.first_error.unwrap_or_default())
                    } else {
                        String::new()
                    }
                );
                failed |= !ok && label == "default";
                if r.errors > 0 {
                    println!("RESULT: FAIL (errors during a throughput run)");
                    exit(1);
                }
            }
        }
    }

    if extra {
        failed |= !extras(
            &server,
            id,
            ip_id,
            &base,
            &l2_queries,
            &truth,
            &ip_stored,
            ip_dim,
            &ip_g,
            &ip_base,
            &queries,
            &ip_queries,
            &ip_truth,
            &efs,
        );
    }

    // shutdown frees the device memory
    let t = Instant::now();
    let r = server.shutdown();
    drop(server);
    let free1 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    let ok = r.is_ok() && free1 + (64 << 20) >= free0;
    println!(
        "{} shutdown: {:?} in {:.1} ms; free device memory {} MiB before start, {} MiB after shutdown",
        if ok { "ok  " } else { "FAIL" },
        r,
        t.elapsed().as_secs_f64() * 1e3,
        free0 >> 20,
        free1 >> 20
    );
    failed |= !ok;

    if fault {
        failed |= !fault_test(gpu, &ip_image, &ip_queries, (base_path.clone(), query_path.clone()));
    }

    if failed {
        println!("RESULT: FAIL");
        exit(1);
    }
    println!("RESULT: PASS");
}

#[allow(clippy::too_many_arguments)]
fn extras(
    server: &SearchServer,
    id: ResidentId,
    ip_id: ResidentId,
    base: &Matrix<f32>,
    l2_queries: &[Vec<f32>],
    truth: &[Vec<(u32, f64)>],
    ip_stored: &[f32],
    ip_dim: usize,
    ip_g: &Graph,
    ip_base: &Matrix<f32>,
    queries: &Matrix<f32>,
    ip_queries: &[Vec<f32>],
    ip_truth: &[Vec<(u32, f64)>],
    efs: &[usize],
) -> bool {
    let mut all_ok = true;
    let mut report = |ok: bool, what: String| {
        println!("{} {what}", if ok { "ok  " } else { "FAIL" });
        all_ok &= ok;
    };
    let ef = *efs.iter().max().unwrap_or(&64);
    let n = base.len();

    // inner product, against the CPU on the same graph
    let ip_store = store_of(ip_g, ip_stored, ip_dim);
    let (cr, _) = cpu_recall(&ip_store, Metric::InnerProduct, queries, ip_truth, ef);
    let mut found = Vec::new();
    let mut bad = None;
    for (qi, q) in ip_queries.iter().enumerate() {
        match server.submit(ip_id, q, K, ef).and_then(|mut t| server.wait(&mut t, WAIT)) {
            Ok(h) => {
                if let Some(e) = check_answer(&h, ip_base.len(), K, q, ip_stored, ip_dim, true, None) {
                    bad.get_or_insert(format!("query {qi}: {e}"));
                }
                found.push(h.iter().map(|x| Metric::InnerProduct.to_sql(x.0)).collect::<Vec<_>>());
            }
            Err(e) => {
                bad.get_or_insert(format!("query {qi}: {e}"));
                found.push(Vec::new());
            }
        }
    }
    let r = mean_recall(&found, ip_truth, K);
    report(
        bad.is_none() && r >= cr - 0.01,
        format!(
            "inner product index ({} rows, fp16 {}): recall@10 {r:.4} at ef {ef} (cpu {cr:.4}){}",
            ip_base.len(),
            server.resident_info(ip_id).map(|i| i.half).unwrap_or(false),
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );

    // both indexes at once, 32 threads
    let errs = AtomicUsize::new(0);
    let cnt = AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..32 {
            let (errs, cnt) = (&errs, &cnt);
            s.spawn(move || {
                for i in 0..200 {
                    let qi = (th * 200 + i) % l2_queries.len();
                    let (ix, q, nn, st, d, ip) = if (th + i) % 2 == 0 {
                        (id, &l2_queries[qi], n, &base.data[..], base.dim, false)
                    } else {
                        (ip_id, &ip_queries[qi], ip_base.len(), ip_stored, ip_dim, true)
                    };
                    match server.submit(ix, q, K, 40).and_then(|mut t| server.wait(&mut t, WAIT)) {
                        Ok(h) if check_answer(&h, nn, K, q, st, d, ip, None).is_none() => {
                            cnt.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            errs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    report(
        errs.load(Ordering::Relaxed) == 0,
        format!(
            "two indexes at once: {} answers checked, {} bad, {:.0} queries/s",
            cnt.load(Ordering::Relaxed),
            errs.load(Ordering::Relaxed),
            cnt.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64()
        ),
    );

    // deletes: the 3 nearest of the first 200 queries and every 20th node
    let mut del = vec![false; n];
    for t in truth.iter().take(200) {
        for &(v, _) in t.iter().take(3) {
            del[v as usize] = true;
        }
    }
    for v in (0..n).step_by(20) {
        del[v] = true;
    }
    let t = Instant::now();
    let mut ok = true;
    // one by one for the first 100, the rest in one batch
    let flagged: Vec<u32> = (0..n as u32).filter(|&v| del[v as usize]).collect();
    for &v in flagged.iter().take(100) {
        ok &= server.update_flags(id, v, FLAG_DELETED).is_ok();
    }
    let rest: Vec<(u32, u8)> = flagged.iter().skip(100).map(|&v| (v, FLAG_DELETED)).collect();
    ok &= server.update_flags_batch(id, &rest).is_ok();
    let upd_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut bad = None;
    for (qi, q) in l2_queries.iter().enumerate().take(200) {
        match server.submit(id, q, K, 64).and_then(|mut t| server.wait(&mut t, WAIT)) {
            Ok(h) => {
                if h.len() != K {
                    bad.get_or_insert(format!("query {qi}: {} hits", h.len()));
                }
                if let Some(e) = check_answer(&h, n, K, q, &base.data, base.dim, false, Some(&del)) {
                    bad.get_or_insert(format!("query {qi}: {e}"));
                }
            }
            Err(e) => {
                bad.get_or_insert(format!("query {qi}: {e}"));
            }
        }
    }
    let undo: Vec<(u32, u8)> = flagged.iter().map(|&v| (v, 0)).collect();
    ok &= server.update_flags_batch(id, &undo).is_ok();
    report(
        ok && bad.is_none(),
        format!(
            "deletes: {} nodes flagged ({upd_ms:.0} ms), 200 queries never returned one{}",
            del.iter().filter(|&&d| d).count(),
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );

    // Busy: hold every slot
    let slots = server.info().slots;
    let mut held = Vec::new();
    let mut first_err = None;
    for _ in 0..slots {
        match server.submit(id, &l2_queries[0], K, 20) {
            Ok(t) => held.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let busy = server.submit(id, &l2_queries[0], K, 20);
    let mut answered = 0;
    for t in held.iter_mut() {
        if server.wait(t, WAIT).is_ok() {
            answered += 1;
        }
    }
    report(
        first_err.is_none() && matches!(busy, Err(SearchError::Busy)) && answered == slots,
        format!(
            "all {slots} slots held: next submit {:?}; {answered} answered{}",
            busy.err(),
            first_err.map(|e| format!("; {e}")).unwrap_or_default()
        ),
    );
    drop(held);

    // abandoned tickets come back
    for i in 0..3 * slots {
        match server.submit(id, &l2_queries[i % l2_queries.len()], K, 40) {
            Ok(t) => drop(t),
            Err(SearchError::Busy) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) => {
                report(false, format!("abandon: {e}"));
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    server.reclaim();
    let mut held = Vec::new();
    for _ in 0..slots {
        if let Ok(t) = server.submit(id, &l2_queries[1], K, 20) {
            held.push(t);
        }
    }
    let got = held.len();
    for t in held.iter_mut() {
        let _ = server.wait(t, WAIT);
    }
    report(got == slots, format!("abandoned tickets: {got} of {slots} slots free again afterwards"));

    // unload
    let b = server.bytes(ip_id).unwrap_or(0);
    let r = server.unload(ip_id);
    let after = server.submit(ip_id, &ip_queries[0], K, 20);
    report(
        r.is_ok() && server.bytes(ip_id).is_none() && matches!(after, Err(SearchError::Invalid(_))),
        format!("unload: {r:?} ({} MiB), a query on it then: {:?}", b >> 20, after.err()),
    );
    // bad arguments
    let r1 = server.submit(id, &l2_queries[0][..5], K, 20);
    let r2 = server.submit(id, &l2_queries[0], 100_000, 20);
    report(
        matches!(r1, Err(SearchError::Invalid(_))) && matches!(r2, Err(SearchError::Invalid(_))),
        format!("bad arguments refused: {:?} / {:?}", r1.err(), r2.err()),
    );
    all_ok
}

fn fault_test(gpu: Gpu, image: &IndexImage, queries: &[Vec<f32>], paths: (String, String)) -> bool {
    let cfg = ServerConfig { allow_fault_injection: true, ..ServerConfig::default() };
    let server = match SearchServer::start(&gpu, cfg.clone()) {
        Ok(s) => s,
        Err(e) => {
            println!("FAIL  fault test: start: {e}");
            return false;
        }
    };
    let id = server.load(image).expect("load");
    let mut pending = server.submit(id, &queries[0], K, 40).expect("submit");
    let _ = server.wait(&mut pending, WAIT);
    let mut pending = Vec::new();
    for q in queries.iter().take(8) {
        if let Ok(t) = server.submit(id, q, K, 40) {
            pending.push(t);
        }
    }
    let t = Instant::now();
    let inj = server.inject_fault();
    // the fault is asynchronous: queries may still be answered for a moment;
    // within 3 s one must fail with Poisoned
    let mut after: Result<(), SearchError> = Ok(());
    let mut answered_after = 0;
    while t.elapsed() < Duration::from_secs(3) {
        after = server
            .submit(id, &queries[1], K, 40)
            .and_then(|mut t| server.wait(&mut t, Duration::from_secs(3)).map(|_| ()));
        if after.is_err() {
            break;
        }
        answered_after += 1;
    }
    let detect_ms = t.elapsed().as_secs_f64() * 1e3;
    let later =
        server.submit(id, &queries[2], K, 40).and_then(|mut t| server.wait(&mut t, Duration::from_secs(3)).map(|_| ()));
    let load_after = server.load(image);
    let poisoned = server.poisoned();
    let ok1 = inj.is_ok()
        && matches!(after, Err(SearchError::Poisoned(_)))
        && matches!(later, Err(SearchError::Poisoned(_)))
        && load_after.is_err()
        && poisoned.is_some();
    println!(
        "{} fault injected: detected in {detect_ms:.1} ms ({answered_after} answered before): {:?}; next submit {:?}; load {:?}",
        if ok1 { "ok  " } else { "FAIL" },
        after.as_ref().err(),
        later.as_ref().err().map(|e| e.to_string()),
        load_after.err().map(|e| e.to_string())
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
    let t = Instant::now();
    let me = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(me)
        .args(["--child-after-fault", "--base", &paths.0, "--query", &paths.1, "--rows", "20000"])
        .output();
    let (child_ok, child_text) = match out {
        Ok(o) => (o.status.success(), String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Err(e) => (false, e.to_string()),
    };
    let ok2 = sd.is_ok() && broken && child_ok;
    println!(
        "{} after the fault: shutdown {:?}, context broken {broken}, server and Gpu dropped in {drop_ms:.1} ms; Gpu::open in this process: {:?}; a new process ({:.0} ms): {child_text}",
        if ok2 { "ok  " } else { "FAIL" },
        sd,
        reopen,
        t.elapsed().as_secs_f64() * 1e3
    );
    ok1 && ok2
}

/// --sim: the CPU model of the kernel against the CPU search.
fn run_sim(
    base: &Matrix<f32>,
    queries: &Matrix<f32>,
    truth: &[Vec<(u32, f64)>],
    params: &BuildParams,
    efs: &[usize],
    pol: Pol,
    variants: &[String],
) {
    let t = Instant::now();
    let g = rnn_descent::build(&base.data, base.dim, params, &mut |_: usize, _: usize| true).expect("build");
    println!("graph: rnn_descent on the CPU in {:.1} s", t.elapsed().as_secs_f64());
    let ix = SimIndex {
        vectors: &base.data,
        dim: base.dim,
        adjacency: &g.adjacency,
        degree: g.degree,
        entry: g.entry.unwrap_or(0),
        flags: &[],
        inner_product: false,
    };
    let mut pols = vec![("default".to_string(), pol)];
    for v in variants {
        let mut p = pol;
        apply(&mut p, v);
        pols.push((v.clone(), p));
    }
    let store = store_of(&g, &base.data, base.dim);
    for &ef in efs {
        let (cr, _) = cpu_recall(&store, Metric::L2, queries, truth, ef);
        println!("ef {ef:>4}: cpu recall@10 {cr:.4}");
        for (label, p) in &pols {
            let ctas = if p.ctas == 0 { 4 } else { p.ctas };
            let plan = p.policy.plan(K, ef, ctas);
            let res: Vec<(Vec<f64>, gpu_graph_gpu::search::sim::SimStats)> = (0..queries.len())
                .into_par_iter()
                .map(|q| {
                    let (h, st) = simulate(&ix, queries.row(q), K, &plan, q as u64);
                    (h.iter().map(|x| Metric::L2.to_sql(x.0)).collect(), st)
                })
                .collect();
            let found: Vec<Vec<f64>> = res.iter().map(|r| r.0.clone()).collect();
            let nq = queries.len() as f64;
            let sum = |f: &dyn Fn(&gpu_graph_gpu::search::sim::SimStats) -> u64| {
                res.iter().map(|r| f(&r.1)).sum::<u64>() as f64 / nq
            };
            println!(
                "   {label:<28} plan {}x{:<4} recall@10 {:.4}  {:>6.0} dist/q  {:>5.0} exp/q  {:>5.1} steps/q  {:>5.1} merges/q  capped {}",
                plan.ctas,
                plan.list,
                mean_recall(&found, truth, K),
                sum(&|s| s.computed),
                sum(&|s| s.expanded),
                sum(&|s| s.steps),
                sum(&|s| s.merges),
                res.iter().filter(|r| r.1.capped > 0).count()
            );
        }
    }
}

/// The process started after a fault: a fresh GPU, server and index (a
/// prefix of the data, brute-force ground truth) answer queries. Prints one
/// line; exit status 0 when recall@10 at ef 40 is above 0.9.
fn child_after_fault(base: Option<&str>, query: Option<&str>, rows: Option<usize>) -> i32 {
    let (Some(bp), Some(qp)) = (base, query) else {
        println!("child: --base and --query needed");
        return 2;
    };
    let base = read_vectors(bp, rows);
    let queries = read_vectors(qp, None);
    let truth = exact_knn(&base.data, base.dim, &queries.data, K, Metric::L2);
    let r = (|| -> Result<f64, String> {
        let gpu = Gpu::open().map_err(|e| format!("Gpu::open: {e}"))?;
        let (g, _) = build(&gpu, &base.data, base.dim, &BuildParams::default(), KnnInit::Auto, &|| false)
            .map_err(|e| format!("build: {e}"))?;
        let server = SearchServer::start(&gpu, ServerConfig::default()).map_err(|e| format!("start: {e}"))?;
        let id = server
            .load(&IndexImage {
                vectors: &base.data,
                stored_dim: base.dim,
                adjacency: &g.adjacency,
                degree: g.degree,
                entry: g.entry.unwrap_or(0),
                flags: None,
                metric: Metric::L2,
            })
            .map_err(|e| format!("load: {e}"))?;
        let mut found = Vec::new();
        for q in 0..queries.len() {
            let h = server
                .submit(id, queries.row(q), K, 40)
                .and_then(|mut t| server.wait(&mut t, WAIT))
                .map_err(|e| format!("query {q}: {e}"))?;
            found.push(h.iter().map(|x| Metric::L2.to_sql(x.0)).collect::<Vec<_>>());
        }
        server.shutdown().map_err(|e| format!("shutdown: {e}"))?;
        Ok(mean_recall(&found, &truth, K))
    })();
    match r {
        Ok(rc) => {
            println!("GPU opened, graph built, server started, {} queries answered, recall@10 {rc:.4}", queries.len());
            if rc > 0.9 {
                0
            } else {
                1
            }
        }
        Err(e) => {
            println!("{e}");
            1
        }
    }
}
