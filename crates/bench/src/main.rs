//! gpu-graph-bench: load a dataset through SQL, build a gpu_graph index, sweep
//! gpu_graph.ef_search and report build time, index size, recall@k,
//! queries/s and latency, as a table and optionally a CSV. `--help` for usage.
//!
//! Recall is tie-aware (data/README.md): a returned row counts when
//! its distance to the query is at most the true k-th neighbour's. Distances
//! are recomputed here from the vectors read from the files, so the server's
//! arithmetic cannot flatter itself; the distances the server returns are
//! checked against the same computation and disagreements are reported.

mod args;
mod chart;
mod data;
mod db;

use args::{Args, Ef};
use data::{Truth, Vectors};
use db::{Answer, EfSetting, Param};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::recall;
use std::io::Write;
use std::time::Instant;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{}", args::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("gpu-graph-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("gpu-graph-bench: error: {e}");
        std::process::exit(1);
    }
}

/// One ef_search setting's measurements.
struct Point {
    ef: String,
    recall: f64,
    qps: f64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn run(a: &Args) -> Result<(), String> {
    let spec = spec_of(a)?;
    let metric = spec.metric;
    let (op, opclass) = db::operator(metric, a.column);
    let mut c = db::connect(a, true)?; // first, to fail fast
    let (base, queries, base_rows_in_file) = read_data(a, &spec)?;
    println!(
        "gpu-graph-bench: {}, {} rows x {} dims, {} ({opclass}, {op}), {} queries, recall@{}, {} client{}",
        spec.name,
        base.len(),
        base.dim,
        metric.name(),
        queries.len(),
        a.k,
        a.clients,
        if a.clients == 1 { "" } else { "s" }
    );
    let (mut gt, gt_source) = data::ground_truth(&spec, &base, base_rows_in_file, &queries, a.k)?;
    println!("ground truth: {gt_source}");
    let index = format!("{}_embedding_idx", a.table);
    let (build_s, index_bytes) = load_and_build(&mut c, a, &base, &index, &opclass)?;
    let mut deleted = std::collections::HashSet::new();
    if let Some(f) = a.delete_fraction {
        let t = Instant::now();
        deleted = db::delete_share(&mut c, &a.table, f, base.len())?;
        println!(
            "deleted {} rows ({:.0}%) and vacuumed in {:.2} s; index now {}",
            deleted.len(),
            100.0 * deleted.len() as f64 / base.len() as f64,
            t.elapsed().as_secs_f64(),
            mib(db::relation_size(&mut c, &index)?)
        );
        gt = data::ground_truth_without(&base, &deleted, &queries, metric, a.k);
        println!("ground truth: brute force over the {} remaining rows", base.len() - deleted.len());
    }
    let sql = db::knn_sql(&a.table, op, a.k, a.column);
    let params: Vec<Param> = (0..queries.len()).map(|i| db::param(a.column, queries.row(i))).collect();
    show_plan(&mut c, &sql, &params[0], &index)?;
    match db::wait_for_worker(&mut c, &sql, &params[0], std::time::Duration::from_secs(180))? {
        db::WorkerWait::NotAsked => {}
        db::WorkerWait::Answered(w) => println!("search worker: answering after {:.2} s", w.as_secs_f64()),
        db::WorkerWait::NoAnswer(w) => {
            println!("search worker: no scan answered in {} s; timing whatever serves them", w.as_secs())
        }
    }
    drop(c);
    let sweep_of = |setting| sweep(a, setting, &sql, metric, &base, &queries, &params, &gt, &deleted);
    let mut runs = vec![Run { index: "gpu_graph", build_s, index_bytes, points: sweep_of(EfSetting::GpuGraph)? }];
    if a.compare_hnsw {
        // pgvector's HNSW on the same column, alone (the planner would pick one)
        let mut c = db::connect(a, true)?;
        db::exec(&mut c, &format!("DROP INDEX {index}"))?;
        let hnsw = format!("{}_hnsw_idx", a.table);
        let took = db::build(&mut c, &a.table, &hnsw, "hnsw", &opclass, Some(&a.hnsw_options))?.as_secs_f64();
        let bytes = db::relation_size(&mut c, &hnsw)?;
        println!("hnsw build: {took:.2} s, index {}", mib(bytes));
        show_plan(&mut c, &sql, &params[0], &hnsw)?;
        drop(c);
        runs.push(Run { index: "hnsw", build_s: Some(took), index_bytes: bytes, points: sweep_of(EfSetting::Hnsw)? });
    }
    if let Some(path) = &a.csv {
        write_csv(path, a, &spec.name, &base, metric, &runs).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("\nwrote {}", path.display());
        if runs.len() > 1 {
            let svg = path.with_extension("svg");
            let title = format!(
                "{}, {} rows, {} ({}), recall@{} against queries/s",
                spec.name,
                base.len(),
                metric.name(),
                a.column.name(),
                a.k
            );
            let series: Vec<(&str, Vec<(f64, f64)>)> =
                runs.iter().map(|r| (r.index, r.points.iter().map(|p| (p.recall, p.qps)).collect())).collect();
            std::fs::write(&svg, chart::svg(&title, &series)).map_err(|e| format!("{}: {e}", svg.display()))?;
            println!("wrote {}", svg.display());
        }
    }
    Ok(())
}

/// One index's build and sweep.
struct Run {
    index: &'static str,
    build_s: Option<f64>,
    index_bytes: i64,
    points: Vec<Point>,
}

/// The files and metric a run reads: a known set, or the given files.
/// A set named by its base file, or by its folder where the file is the
/// generators' plain `base.fvecs` (make_sift128.py, make_latent.py).
fn set_name(base: &std::path::Path) -> String {
    let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    match base.parent().and_then(|d| d.file_name()) {
        Some(dir) if stem == "base" => dir.to_string_lossy().into_owned(),
        _ => stem,
    }
}

fn spec_of(a: &Args) -> Result<data::Spec, String> {
    let mut spec = match (&a.dataset, &a.base) {
        (Some(name), _) => data::known(name, &a.data_dir)?,
        (None, Some(base)) => data::Spec {
            name: set_name(base),
            base: base.clone(),
            query: a.query.clone().expect("checked by args"),
            metric: a.metric.expect("checked by args"),
            gt: a.gt.iter().map(|p| data::GtFile { path: p.clone(), covers: None }).collect(),
        },
        (None, None) => unreachable!("checked by args"),
    };
    if let Some(m) = a.metric {
        if m != spec.metric {
            spec.gt.clear(); // the files rank by the set's own metric
        }
        spec.metric = m;
    }
    Ok(spec)
}

/// Base rows, queries, and the rows the base file holds. --rows and
/// --queries are upper bounds: a smaller file (the repository's sample) is
/// used whole, and a line says so; what is reported (the header line, the
/// CSV's rows) is what was loaded.
fn read_data(a: &Args, spec: &data::Spec) -> Result<(Vectors, Vectors, usize), String> {
    let base_rows_in_file = data::rows_in_file(&spec.base)?;
    let base = data::read_vectors(&spec.base, a.rows)?;
    if let Some(r) = a.rows.filter(|&r| r > base.len()) {
        println!("note: --rows {r}, but {} holds {} rows: loading all of them", spec.base.display(), base.len());
    }
    let queries = data::read_vectors(&spec.query, a.queries)?;
    if let Some(n) = a.queries.filter(|&n| n > queries.len()) {
        println!(
            "note: --queries {n}, but {} holds {} queries: running all of them",
            spec.query.display(),
            queries.len()
        );
    }
    if queries.dim != base.dim {
        return Err(format!("queries have {} dimensions, base rows {}", queries.dim, base.dim));
    }
    Ok((base, queries, base_rows_in_file))
}

/// Loads the table and builds the index (unless told to skip either): the
/// build's seconds and the index's bytes.
fn load_and_build(
    c: &mut postgres::Client,
    a: &Args,
    base: &Vectors,
    index: &str,
    opclass: &str,
) -> Result<(Option<f64>, i64), String> {
    if a.skip_load {
        let n = db::count_rows(c, &a.table)?;
        if n != base.len() {
            return Err(format!("--skip-load: table {} holds {n} rows, expected {}", a.table, base.len()));
        }
        println!("load: skipped (table {} holds {n} rows)", a.table);
    } else {
        let t = db::load(c, &a.table, base, a.column_storage.as_deref(), a.column)?;
        let size = db::relation_size(c, &a.table)?;
        println!("load (COPY + ANALYZE): {:.2} s, table {}", t.as_secs_f64(), mib(size));
    }
    if a.load_only {
        std::process::exit(0);
    }
    let build_s = if a.skip_build {
        println!("build: skipped (reusing {index})");
        None
    } else {
        db::extensions(c, a.column)?;
        Some(db::build(c, &a.table, index, "gpu_graph", opclass, a.index_options.as_deref())?.as_secs_f64())
    };
    let index_bytes = db::relation_size(c, index)?;
    match build_s {
        Some(s) => println!("build: {s:.2} s, index {}", mib(index_bytes)),
        None => println!("index {}", mib(index_bytes)),
    }
    Ok((build_s, index_bytes))
}

/// Prints the plan's nodes, and a warning when it does not use the index.
fn show_plan(c: &mut postgres::Client, sql: &str, q: &Param, index: &str) -> Result<(), String> {
    let plan = db::explain(c, sql, q)?;
    let uses_index = plan.iter().any(|l| l.contains(&format!("Index Scan using {index}")));
    // the plan nodes only: their detail lines repeat the whole query vector
    let nodes: Vec<&str> = plan
        .iter()
        .enumerate()
        .filter(|(i, l)| *i == 0 || l.trim_start().starts_with("->"))
        .map(|(_, l)| l.trim().trim_start_matches("->").trim())
        .collect();
    println!("plan: {}", nodes.join(" -> "));
    if !uses_index {
        println!("WARNING: the planner does not use {index} for this query; the numbers below are not the index's");
    }
    Ok(())
}

/// Every ef_search setting over all clients: the table, a few answers, and
/// the measurements. A deleted row returned is an error.
#[allow(clippy::too_many_arguments)]
fn sweep(
    a: &Args,
    setting: EfSetting,
    sql: &str,
    metric: Metric,
    base: &Vectors,
    queries: &Vectors,
    params: &[Param],
    gt: &[Truth],
    deleted: &std::collections::HashSet<i32>,
) -> Result<Vec<Point>, String> {
    let mut clients: Vec<postgres::Client> = (0..a.clients).map(|_| db::connect(a, false)).collect::<Result<_, _>>()?;
    let (mut points, mut last_answers) = (Vec::new(), Vec::new());
    println!();
    if a.compare_hnsw {
        println!("{}:", setting.name());
    }
    let recall_k = format!("recall@{}", a.k);
    println!(
        "{:>10} {:>10} {:>11} {:>9} {:>8} {:>8}",
        "ef_search", recall_k, "queries/s", "mean ms", "p50 ms", "p99 ms"
    );
    for (i, ef) in a.ef.iter().enumerate() {
        let (p, answers) = sweep_point(a, &mut clients, setting, sql, *ef, metric, base, queries, params, gt)?;
        let returned_deleted = answers.iter().flatten().filter(|r| deleted.contains(&r.0)).count();
        if returned_deleted > 0 {
            return Err(format!("ef_search {}: {returned_deleted} deleted rows returned", p.ef));
        }
        if i + 1 == a.ef.len() {
            last_answers = answers;
        }
        println!(
            "{:>10} {:>10.4} {:>11.1} {:>9.3} {:>8.3} {:>8.3}",
            p.ef, p.recall, p.qps, p.mean_ms, p.p50_ms, p.p99_ms
        );
        points.push(p);
    }
    print_examples(a, gt, &last_answers);
    Ok(points)
}

/// Runs every query at one ef_search over all clients: the measurements and
/// each query's answer.
#[allow(clippy::too_many_arguments)]
fn sweep_point(
    a: &Args,
    clients: &mut [postgres::Client],
    setting: EfSetting,
    sql: &str,
    ef: Ef,
    metric: Metric,
    base: &Vectors,
    queries: &Vectors,
    params: &[Param],
    gt: &[Truth],
) -> Result<(Point, Vec<Answer>), String> {
    let mut ef_shown = String::new();
    let mut statements = Vec::new();
    for c in clients.iter_mut() {
        ef_shown = db::set_ef(
            c,
            setting,
            match ef {
                Ef::Default => None,
                Ef::Value(v) => Some(v),
            },
        )?;
        statements.push(db::prepare(c, sql)?);
        for q in params.iter().take(a.warmup.div_ceil(a.clients)) {
            db::run_query(c, statements.last().unwrap(), q)?;
        }
    }
    let ef_label = match ef {
        Ef::Default => format!("{ef_shown}*"),
        Ef::Value(_) => ef_shown,
    };

    // the work: one query a statement, or with --batch (gpu_graph's sweep)
    // ranges of queries a gpu_graph_search_batch call; unit i goes to
    // client i % clients
    let nq = queries.len();
    let nc = clients.len();
    let batch = a.batch.filter(|_| setting == EfSetting::GpuGraph);
    let units: Vec<std::ops::Range<usize>> = match batch {
        Some(n) => (0..nq).step_by(n).map(|s| s..(s + n).min(nq)).collect(),
        None => (0..nq).map(|q| q..q + 1).collect(),
    };
    let batch_statements = match batch {
        Some(_) => {
            let sql = db::batch_sql(&a.table, &format!("{}_embedding_idx", a.table), a.k);
            clients.iter_mut().map(|c| db::prepare(c, &sql).map(Some)).collect::<Result<Vec<_>, _>>()?
        }
        None => vec![None; nc],
    };
    let units = &units;
    let start = Instant::now();
    type Done = (Vec<(usize, Answer)>, Vec<f64>); // (query, answer) and each unit's latency (ms)
    let per_client: Vec<Result<Done, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .zip(statements.iter().zip(&batch_statements))
            .enumerate()
            .map(|(ci, (c, (st, bst)))| {
                s.spawn(move || {
                    let (mut out, mut lat) = (Vec::new(), Vec::new());
                    for r in units.iter().skip(ci).step_by(nc) {
                        let dt = match bst {
                            Some(bst) => {
                                let (rows, dt) = db::run_batch(
                                    c,
                                    bst,
                                    &queries.data[r.start * queries.dim..r.end * queries.dim],
                                    queries.dim,
                                    r.len(),
                                )?;
                                out.extend(rows.into_iter().enumerate().map(|(j, a)| (r.start + j, a)));
                                dt
                            }
                            None => {
                                let (rows, dt) = db::run_query(c, st, &params[r.start])?;
                                out.push((r.start, rows));
                                dt
                            }
                        };
                        lat.push(dt.as_secs_f64() * 1e3);
                    }
                    Ok((out, lat))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread panicked")).collect()
    });
    let wall = start.elapsed();

    let mut answers: Vec<Answer> = vec![Vec::new(); nq];
    let mut latencies = Vec::with_capacity(units.len());
    for r in per_client {
        let (out, lat) = r?;
        for (qi, rows) in out {
            answers[qi] = rows;
        }
        latencies.extend(lat);
    }

    let mut recall_sum = 0.0;
    let mut mismatch: Option<(usize, i32, f64, f64)> = None;
    let mut mismatches = 0usize;
    for (qi, rows) in answers.iter().enumerate() {
        let q = queries.row(qi);
        let ids: Vec<i32> = rows.iter().map(|r| r.0).collect();
        recall_sum += recall_of(metric, base, q, &gt[qi], &ids, a.k);
        for &(id, d_sql) in rows {
            if id < 0 || id as usize >= base.len() {
                continue;
            }
            let d = recall::operator_distance(metric, q, base.row(id as usize));
            let agrees = (d_sql - d).abs() <= 1e-3 * d.abs().max(1.0); // false for NaN
            if !agrees {
                mismatches += 1;
                mismatch.get_or_insert((qi, id, d_sql, d));
            }
        }
    }
    if let Some((qi, id, d_sql, d)) = mismatch {
        println!(
            "WARNING: {mismatches} returned distances disagree with the vectors' (first: query {qi}, id {id}: server {d_sql}, expected {d})"
        );
    }

    latencies.sort_by(|x, y| x.total_cmp(y));
    let pct = |p: f64| latencies[((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len()) - 1];
    let point = Point {
        ef: ef_label,
        recall: recall_sum / nq as f64,
        qps: nq as f64 / wall.as_secs_f64(),
        mean_ms: latencies.iter().sum::<f64>() / latencies.len() as f64,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
    };
    Ok((point, answers))
}

/// Tie-aware recall@k of one answer (`recall::recall_at_k` over the
/// distances recomputed from the vectors). A row returned twice or an id that
/// is not a loaded row fills a slot without counting.
fn recall_of(metric: Metric, base: &Vectors, q: &[f32], gt: &[(u32, f64)], ids: &[i32], k: usize) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let dists: Vec<f64> = ids
        .iter()
        .take(k)
        .map(|&id| {
            if id >= 0 && (id as usize) < base.len() && seen.insert(id) {
                recall::operator_distance(metric, q, base.row(id as usize))
            } else {
                f64::INFINITY
            }
        })
        .collect();
    recall::recall_at_k(&dists, gt[k - 1].1, k)
}

/// The answers of the first --examples queries beside the exact ones.
fn print_examples(a: &Args, gt: &[Truth], answers: &[Answer]) {
    for qi in 0..a.examples.min(answers.len()) {
        println!("\nquery {qi}: returned (id: distance)            exact top {}", a.k);
        for r in 0..a.k {
            let got = answers[qi].get(r).map(|(id, d)| format!("{id:>8}: {d:<12.4}")).unwrap_or_default();
            let want = gt[qi].get(r).map(|&(id, d)| format!("{id:>8}: {d:.4}")).unwrap_or_default();
            println!("  {got:<30}  {want}");
        }
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn write_csv(
    path: &std::path::Path,
    a: &Args,
    dataset: &str,
    base: &Vectors,
    metric: Metric,
    runs: &[Run],
) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    // index_options: the one field that may hold commas (quoted); the
    // column type and the index kind after it, so earlier columns keep
    // their places for the scripts that read them
    writeln!(
        f,
        "dataset,rows,dims,metric,clients,k,build_s,index_bytes,ef_search,recall,qps,mean_ms,p50_ms,p99_ms,index_options,column,index"
    )?;
    for r in runs {
        let opts = match r.index {
            "hnsw" => a.hnsw_options.clone(),
            _ => a.index_options.clone().unwrap_or_default(),
        }
        .replace('"', "\"\"");
        for p in &r.points {
            writeln!(
                f,
                "{dataset},{},{},{},{},{},{},{},{},{:.4},{:.1},{:.3},{:.3},{:.3},\"{opts}\",{},{}",
                base.len(),
                base.dim,
                metric.name(),
                a.clients,
                a.k,
                r.build_s.map(|s| format!("{s:.3}")).unwrap_or_default(),
                r.index_bytes,
                p.ef.trim_end_matches('*'),
                p.recall,
                p.qps,
                p.mean_ms,
                p.p50_ms,
                p.p99_ms,
                a.column.name(),
                r.index
            )?;
        }
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_ties_and_ignores_duplicates() {
        // 1-d points 0, 1, 1, 2, 3; query at 0; k = 3: true 3rd neighbour at distance 1
        let base = Vectors { data: vec![0.0, 1.0, 1.0, 2.0, 3.0], dim: 1 };
        let q = [0.0f32];
        let gt = [(0u32, 0.0), (1, 1.0), (2, 1.0)];
        assert_eq!(recall_of(Metric::L2, &base, &q, &gt, &[0, 2, 1], 3), 1.0);
        assert_eq!(recall_of(Metric::L2, &base, &q, &gt, &[0, 1, 1], 3), 2.0 / 3.0);
        assert_eq!(recall_of(Metric::L2, &base, &q, &gt, &[0, 3, 4], 3), 1.0 / 3.0);
        assert_eq!(recall_of(Metric::L2, &base, &q, &gt, &[0, 99, -1], 3), 1.0 / 3.0);
        assert_eq!(recall_of(Metric::L2, &base, &q, &gt, &[], 3), 0.0);
    }
}
