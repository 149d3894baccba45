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
//! 5. the batch kernel: answers and recall as in 3, queries/s by batch
//!    size, single queries beside a large batch;
//! 6. deletes (never returned after update_flags), both indexes at once,
//!    unload, Busy, abandoned tickets, shutdown (memory freed), and a fault
//!    injected into the kernel: every call errs, then a new process serves
//!    again.
//!
//! `--sim` runs only the CPU model of the kernel (no GPU needed): recall and
//! work of search plans against the CPU search, on a graph built on the CPU.
//!
//! Exits 1 on a recall gap or any error, 2 on a usage or I/O error.
//! Policy and variant keys: ctas (per slot), per (list per CTA), seeds,
//! scan (the nodes measured at the start in place of entry and seeds),
//! beam, offset, capf, cape.

mod batch;
#[path = "../common/mod.rs"]
mod common;
mod extras;
mod fault;
mod patches;
mod sim;
mod throughput;

use std::process::exit;
use std::time::{Duration, Instant};

use clap::Parser;
use common::{cpu_recall, number, pairs, usage, Data, DataArgs, GraphArgs, Verdict, K};
use gpu_graph_engine::distance::dot;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::recall::{exact_knn, mean_recall};
use gpu_graph_gpu::search::answers::{self, AnswerArea, Route};
use gpu_graph_gpu::search::{ResidentId, SearchPolicy, SearchServer, ServerConfig};
use gpu_graph_gpu::{build, Gpu, KnnInit};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const WAIT: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(about = "The persistent GPU search kernel: answers, recall, throughput, failures")]
struct Opts {
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    graph: GraphArgs,
    #[arg(long, value_delimiter = ',', default_values_t = [10, 20, 40, 64, 100])]
    efs: Vec<usize>,
    /// Submitter threads of the throughput runs.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 64])]
    threads: Vec<usize>,
    /// Seconds per throughput run.
    #[arg(long, default_value_t = 1.5)]
    secs: f64,
    /// CTAs per slot (0: the server's default).
    #[arg(long, default_value_t = 0)]
    ctas: usize,
    /// Query slots (0: as many as fit).
    #[arg(long, default_value_t = 0)]
    slots: usize,
    /// Warps of each CTA (0: the server's default).
    #[arg(long, default_value_t = 0)]
    cta_warps: usize,
    /// Queries reach the kernel by a driver copy and stream write each, not
    /// through the doorbell (the A/B).
    #[arg(long)]
    copy_requests: bool,
    /// The search policy (key=value,...).
    #[arg(long, default_value = "")]
    policy: String,
    /// Throughput of another policy too (key=value,...).
    #[arg(long)]
    variant: Vec<String>,
    /// Threads of the variants' runs (default: the last of --threads).
    #[arg(long, value_delimiter = ',')]
    variant_threads: Vec<usize>,
    /// Rows of the inner-product index.
    #[arg(long, default_value_t = 20_000)]
    ip_rows: usize,
    #[arg(long)]
    no_extra: bool,
    #[arg(long)]
    no_fault: bool,
    /// Resident blocks per SM the batch kernel is compiled for (0: none).
    #[arg(long, default_value_t = gpu_graph_gpu::search::plan::DEFAULT_BATCH_MIN_BLOCKS)]
    batch_min_blocks: u32,
    /// Only the CPU model of the kernel.
    #[arg(long)]
    sim: bool,
    /// Only what patches of a resident copy cost (measured, not checked).
    #[arg(long)]
    patch_costs: bool,
    /// (internal) the process started after a fault.
    #[arg(long, hide = true)]
    child_after_fault: bool,
}

/// CTAs per slot and a search policy.
#[derive(Clone, Copy, Debug)]
pub struct Pol {
    pub ctas: usize,
    pub policy: SearchPolicy,
}

impl Pol {
    pub fn with(mut self, spec: &str) -> Pol {
        for (k, v) in pairs(spec) {
            let n: usize = number(&k, &v);
            let p = &mut self.policy;
            match k.as_str() {
                "ctas" => self.ctas = n,
                "per" => p.list_per_cta = n,
                "seeds" => p.seeds = n,
                "scan" => p.scan = n,
                "beam" => p.beam_width = n,
                "offset" => p.offset_beam = n,
                "capf" => p.cap_factor = n,
                "cape" => p.cap_extra = n,
                _ => usage(&format!("unknown key {k:?}")),
            }
        }
        self
    }
}

/// The two indexes of the test and their prepared queries.
pub struct Indexes {
    pub l2: FlatIndex,
    pub l2_queries: Vec<Vec<f32>>,
    /// inner product over a prefix of the base, MIPS-augmented
    pub ip: FlatIndex,
    pub ip_queries: Vec<Vec<f32>>,
    pub ip_truth: Vec<Vec<(u32, f64)>>,
}

/// Both graphs, built on the GPU before the server starts (see
/// SearchServer::start on lazy module loading).
fn indexes(gpu: &Gpu, data: &Data, o: &Opts) -> Indexes {
    let params = o.graph.params();
    let (base, queries) = (&data.base, &data.queries);
    let t = Instant::now();
    let (g, pt) = build(gpu, &base.data, base.dim, &params, KnnInit::Auto, &|| false)
        .unwrap_or_else(|e| fatal(&format!("GPU build: {e}")));
    println!(
        "graph: GRNND on the GPU, degree {}, {:.0} ms (wall {:.0} ms), entry {:?}",
        g.degree,
        pt.total_ms(),
        t.elapsed().as_secs_f64() * 1e3,
        g.entry
    );
    let ipn = o.ip_rows.min(base.len());
    let prefix = &base.data[..ipn * base.dim];
    let max_norm = prefix.chunks(base.dim).map(|r| dot(r, r).sqrt()).fold(0f32, f32::max);
    let mut ip_stored = Vec::with_capacity(ipn * (base.dim + 1));
    for r in prefix.chunks(base.dim) {
        Metric::InnerProduct.prepare_stored(r, max_norm, &mut ip_stored);
    }
    let (ip_g, _) = build(gpu, &ip_stored, base.dim + 1, &params, KnnInit::Auto, &|| false)
        .unwrap_or_else(|e| fatal(&format!("GPU build (inner product): {e}")));
    let prepared = |m: Metric| (0..queries.len()).map(|q| m.prepare_query(queries.row(q))).collect::<Vec<_>>();
    Indexes {
        l2: FlatIndex::new(Metric::L2, base.dim, base.data.clone(), g),
        l2_queries: prepared(Metric::L2),
        ip: FlatIndex::new(Metric::InnerProduct, base.dim + 1, ip_stored, ip_g),
        ip_queries: prepared(Metric::InnerProduct),
        ip_truth: exact_knn(prefix, base.dim, &queries.data, K, Metric::InnerProduct),
    }
}

fn fatal(what: &str) -> ! {
    println!("FAIL  {what}");
    exit(1)
}

/// Answers of `queries` (nearest first, or why a query has none) checked
/// one by one against `ix`: recall@10 against `truth` (operator
/// distances) and the first bad answer.
pub fn score<'a>(
    answers: impl IntoIterator<Item = Result<&'a [(f32, u32)], String>>,
    ix: &FlatIndex,
    queries: &[Vec<f32>],
    truth: &[Vec<(u32, f64)>],
) -> (f64, Option<String>) {
    let mut bad = None;
    let found: Vec<Vec<f64>> = answers
        .into_iter()
        .zip(queries)
        .enumerate()
        .map(|(qi, (a, q))| match a {
            Ok(a) => {
                if let Some(e) = check_answer(a, ix, K, q, None) {
                    bad.get_or_insert(format!("query {qi}: {e}"));
                }
                a.iter().map(|h| ix.metric.to_sql(h.0)).collect()
            }
            Err(e) => {
                bad.get_or_insert(format!("query {qi}: {e}"));
                Vec::new()
            }
        })
        .collect();
    (mean_recall(&found, truth, K), bad)
}

/// Checks one answer against its index; an error text or None.
pub fn check_answer(
    hits: &[(f32, u32)],
    ix: &FlatIndex,
    k: usize,
    q: &[f32],
    deleted: Option<&[bool]>,
) -> Option<String> {
    if hits.len() > k || hits.is_empty() {
        return Some(format!("{} hits for k {k}", hits.len()));
    }
    if let Some(w) = hits.windows(2).find(|w| w[0].0 > w[1].0) {
        return Some(format!("not sorted: {:?} then {:?}", w[0], w[1]));
    }
    let mut ids: Vec<u32> = hits.iter().map(|h| h.1).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Some("a node twice".into());
    }
    for &(d, v) in hits {
        if v as usize >= ix.len() {
            return Some(format!("node {v} of {}", ix.len()));
        }
        if deleted.is_some_and(|del| del[v as usize]) {
            return Some(format!("deleted node {v} returned"));
        }
        let e = ix.metric.search_distance(q, ix.vector(v));
        if (e - d).abs() > 1e-4 * e.abs().max(1.0) {
            return Some(format!("node {v}: distance {d}, host says {e}"));
        }
    }
    None
}

fn start_server(gpu: &Gpu, o: &Opts, pol: Pol) -> SearchServer {
    let cfg = ServerConfig {
        slots: o.slots,
        ctas_per_slot: pol.ctas,
        cta_warps: o.cta_warps,
        copy_requests: o.copy_requests,
        policy: pol.policy,
        batch_min_blocks: o.batch_min_blocks,
        ..ServerConfig::default()
    };
    // answers in memory of this program's own (as the worker gives its
    // shared memory): check_pass reads each answer's rows there
    let bytes = answers::area_bytes(&cfg).expect("sizes").next_multiple_of(4096);
    let layout = std::alloc::Layout::from_size_align(bytes, 4096).expect("layout");
    // SAFETY: a non-zero size; leaked, so it outlives the server.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    ANSWER_AREA.store(ptr as usize, Ordering::Relaxed);
    let cfg = ServerConfig { answer_area: Some(AnswerArea { ptr: ptr as usize, len: bytes }), ..cfg };
    let t = Instant::now();
    let server = SearchServer::start(gpu, cfg).unwrap_or_else(|e| fatal(&format!("SearchServer::start: {e}")));
    let si = server.info();
    println!(
        "server: started in {:.0} ms (compile+load {:.0} ms): {} slots x {} CTAs of {} warps, {} ({} blocks/SM x {} SMs resident, {} B shared each), {} groups, visited 2^{} per slot, stream mem ops {}, {} MiB device, {} MiB pinned",
        t.elapsed().as_secs_f64() * 1e3,
        si.compile_ms,
        si.slots,
        si.ctas_per_slot,
        si.cta_warps,
        if si.doorbell { "doorbell" } else { "copied requests" },
        si.blocks_per_sm,
        si.sm_count,
        si.shared_bytes,
        si.groups,
        si.visited_log2,
        si.stream_mem_ops.as_ref().map_or_else(|e| format!("no ({e})"), |_| "yes".into()),
        si.device_bytes >> 20,
        si.pinned_bytes >> 20
    );
    server
}

/// The row a node is loaded with (check_pass finds it beside each hit).
fn row_of(node: u32) -> u64 {
    node as u64 * 3 + (1 << 40)
}

/// Where the answers of the last server started lie (start_server).
static ANSWER_AREA: AtomicUsize = AtomicUsize::new(0);

fn load(server: &SearchServer, ix: &FlatIndex, what: &str) -> ResidentId {
    let t = Instant::now();
    let rows: Vec<u64> = (0..ix.len() as u32).map(row_of).collect();
    let id = server.load_with_rows(ix, Some(&rows)).unwrap_or_else(|e| fatal(&format!("load ({what}): {e}")));
    let ri = server.resident_info(id).expect("just loaded");
    println!(
        "load ({what}): {} rows in {:.0} ms, {} MiB on the device, fp16 {}",
        ri.n,
        t.elapsed().as_secs_f64() * 1e3,
        ri.bytes >> 20,
        ri.half
    );
    id
}

/// Every query once per ef, one thread, each answer verified on the host;
/// stops at the first bad answer.
fn check_pass(
    server: &SearchServer,
    id: ResidentId,
    ix: &Indexes,
    data: &Data,
    efs: &[usize],
    cpu: &[f64],
    verdict: &mut Verdict,
) {
    println!("check: every query once per ef, one thread; answers verified on the host");
    for (ei, &ef) in efs.iter().enumerate() {
        let plan = server.plan(K, ef);
        let (mut found, mut bad, mut first_bad) = (Vec::new(), 0, None);
        let t = Instant::now();
        let (mut comp, mut exp) = (0u64, 0u64);
        for (qi, q) in ix.l2_queries.iter().enumerate() {
            let mut route = None;
            let answer = server.submit(id, q, K, ef).and_then(|mut tk| {
                route = Some(tk.route());
                server.wait(&mut tk, WAIT)
            });
            match answer {
                Ok(a) => {
                    if let Some(e) = check_answer(&a.hits, &ix.l2, K, q, None)
                        .or_else(|| route.and_then(|r| check_rows(server, r, &a.hits)))
                    {
                        bad += 1;
                        first_bad.get_or_insert(format!("query {qi}: {e}"));
                    }
                    (comp, exp) = (comp + a.computed as u64, exp + a.expanded as u64);
                    found.push(a.hits.iter().map(|h| Metric::L2.to_sql(h.0)).collect::<Vec<_>>());
                }
                Err(e) => {
                    bad += 1;
                    first_bad.get_or_insert(format!("query {qi}: {e}"));
                    found.push(Vec::new());
                }
            }
        }
        let r = mean_recall(&found, &data.truth, K);
        let nq = ix.l2_queries.len() as f64;
        verdict.check(
            bad == 0 && r >= cpu[ei] - 0.01,
            format!(
                "gpu   ef {ef:>4}: recall@10 {r:.4} (cpu {:.4}), plan {}x{} (beam {} from {}, scan {}, seeds {}, cap {}), {:.0} distances, {:.0} expansions per query, {:.1} us per query sequential{}",
                cpu[ei],
                plan.ctas,
                plan.list,
                plan.beam_width,
                plan.offset_beam,
                plan.scan,
                plan.seeds,
                plan.max_expand,
                comp as f64 / nq,
                exp as f64 / nq,
                t.elapsed().as_secs_f64() * 1e6 / nq,
                first_bad.map(|e| format!("; {bad} bad, first: {e}")).unwrap_or_default()
            ),
        );
        if bad > 0 {
            println!("RESULT: FAIL (stopping at the first bad answer)");
            exit(1);
        }
    }
}

/// The answer as read from the answer area by its route (as the worker's
/// scans read theirs): the same hits, each with its node's row. Read after
/// the server's own collect, before anything else used the slot.
fn check_rows(server: &SearchServer, r: Route, hits: &[(f32, u32)]) -> Option<String> {
    let si = server.info();
    if !si.answer_area {
        return Some("the server did not take the answer area".into());
    }
    let l = si.answer_layout;
    let base = ANSWER_AREA.load(Ordering::Relaxed) as *const u8;
    // SAFETY: the area outlives the server; the query finished (its answer
    // was collected) and nothing has used its slot since (one thread).
    let blocks = unsafe {
        if !answers::finished(base, &l, &r) {
            return Some(format!("finish word of slot {} is not {:#x}", r.slot, r.cmd));
        }
        answers::read(base.add(l.results_at as usize), &l, &r)
    };
    let got = match blocks {
        Ok(b) => b.merged_rows(|_| true),
        Err(e) => return Some(format!("reading the answer area: {e}")),
    };
    let with_rows: Vec<(f32, u32)> = got.iter().map(|h| (h.0, h.1)).collect();
    if with_rows != hits {
        return Some(format!("the area's hits {with_rows:?} are not the answer's {hits:?}"));
    }
    got.iter()
        .find(|h| h.2 != row_of(h.1))
        .map(|h| format!("node {}: row {:#x} beside the hit, loaded {:#x}", h.1, h.2, row_of(h.1)))
}

/// Shutdown frees the device memory the server took.
fn shutdown(gpu: &Gpu, server: SearchServer, free0: usize, verdict: &mut Verdict) {
    let t = Instant::now();
    let r = server.shutdown();
    drop(server);
    let free1 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    verdict.check(
        r.is_ok() && free1 + (64 << 20) >= free0,
        format!(
            "shutdown: {r:?} in {:.1} ms; free device memory {} MiB before start, {} MiB after shutdown",
            t.elapsed().as_secs_f64() * 1e3,
            free0 >> 20,
            free1 >> 20
        ),
    );
}

fn main() {
    let o = Opts::parse();
    if o.child_after_fault {
        exit(fault::child(&o.data));
    }
    let data = o.data.load(Metric::L2);
    let pol = Pol { ctas: o.ctas, policy: SearchPolicy::default() }.with(&o.policy);
    if o.sim {
        sim::run(&data, &o.graph.params(), &o.efs, pol, &o.variant);
        return;
    }
    let mut verdict = Verdict::default();
    let gpu = common::open_gpu();
    let ix = indexes(&gpu, &data, &o);
    let cpu: Vec<f64> = o
        .efs
        .iter()
        .map(|&ef| {
            let (r, qps) = cpu_recall(&ix.l2, Metric::L2, &data.queries, &data.truth, ef);
            println!(
                "cpu   ef {ef:>4}: recall@10 {r:.4} ({qps:.0} queries/s on {} threads)",
                rayon::current_num_threads()
            );
            r
        })
        .collect();
    let free0 = gpu.mem_info().map(|m| m.0).unwrap_or(0);
    let server = start_server(&gpu, &o, pol);
    let id = load(&server, &ix.l2, "l2");
    if o.patch_costs {
        patches::costs(&server, id, &ix.l2, &ix.l2_queries);
        shutdown(&gpu, server, free0, &mut verdict);
        return;
    }
    let ip_id = load(&server, &ix.ip, "inner product");
    check_pass(&server, id, &ix, &data, &o.efs, &cpu, &mut verdict);
    let variant_threads =
        if o.variant_threads.is_empty() { vec![*o.threads.last().unwrap_or(&64)] } else { o.variant_threads.clone() };
    let runs = throughput::Runs { server: &server, id, ix: &ix, data: &data, efs: &o.efs, cpu: &cpu, secs: o.secs };
    runs.all(pol, &o.threads, &o.variant, &variant_threads, &mut verdict);
    batch::run(&server, (id, ip_id), &ix, &data, &o.efs, &cpu, &mut verdict);
    if !o.no_extra {
        extras::run(&server, (id, ip_id), &ix, &data, &o.efs, &mut verdict);
    }
    shutdown(&gpu, server, free0, &mut verdict);
    if !o.no_fault {
        fault::test(gpu, &ix.ip, &ix.ip_queries, &o.data, &mut verdict);
    }
    verdict.finish()
}
