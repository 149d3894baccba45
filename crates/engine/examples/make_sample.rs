//! Writes the repository's small data sample (`data/`) from the full sets:
//! a prefix of each base and query file, copied byte for byte, and exact
//! top-100 ground truth over exactly the rows of the sample's base file
//! (engine::recall::exact_knn: the SQL operator's distance, ties by id).
//! The file names are those of the full sets, so code that reads a data
//! folder reads either.
//!
//!   cargo run --release -p gpu_graph_engine --example make_sample -- \
//!       [--from DIR] [--to DIR] [--sift-rows N] [--sift-queries N] \
//!       [--minilm-rows N] [--minilm-queries N]
//!
//! --from: the full sets (default `$GPU_GRAPH_DATA`, else ../shared/data
//! beside the repository); --to: where the sample goes (default the
//! repository's data/). Before writing, it checks that exact_knn reproduces
//! the full sets' own ground-truth files for the sampled queries (same
//! distance at every rank), so the sample's ground truth follows the same
//! convention as theirs. data/README.md says what the files are; keep it in
//! step when the sizes change.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpu_graph_engine::dataset::{count_rows, read_ivecs, read_vectors, Matrix};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::recall::{exact_knn, operator_distance};

/// Ground-truth depth, as in the full sets.
const TOP: usize = 100;

type Result<T> = std::result::Result<T, String>;

struct Args {
    from: PathBuf,
    to: PathBuf,
    sift_rows: usize,
    sift_queries: usize,
    minilm_rows: usize,
    minilm_queries: usize,
}

fn main() {
    if let Err(e) = parse_args().and_then(|a| run(&a)) {
        eprintln!("make_sample: error: {e}");
        std::process::exit(1);
    }
}

fn parse_args() -> Result<Args> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut a = Args {
        from: std::env::var_os("GPU_GRAPH_DATA")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("../shared/data")),
        to: root.join("data"),
        sift_rows: 25_000,
        sift_queries: 200,
        minilm_rows: 900,
        minilm_queries: 60,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag}: missing value"))?;
        let n = || v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("{flag}: `{v}` is not a count"));
        match flag.as_str() {
            "--from" => a.from = v.into(),
            "--to" => a.to = v.into(),
            "--sift-rows" => a.sift_rows = n()?,
            "--sift-queries" => a.sift_queries = n()?,
            "--minilm-rows" => a.minilm_rows = n()?,
            "--minilm-queries" => a.minilm_queries = n()?,
            _ => return Err(format!("unknown option `{flag}` (see the header of examples/make_sample.rs)")),
        }
    }
    a.from = std::fs::canonicalize(&a.from).map_err(|e| format!("--from {}: {e}", a.from.display()))?;
    std::fs::create_dir_all(&a.to).map_err(|e| format!("--to {}: {e}", a.to.display()))?;
    a.to = std::fs::canonicalize(&a.to).map_err(|e| format!("--to {}: {e}", a.to.display()))?;
    if a.from == a.to {
        return Err(format!("--from and --to are the same folder ({})", a.to.display()));
    }
    Ok(a)
}

/// One set of the full folder and how much of it the sample keeps.
struct Set {
    name: &'static str,
    base: &'static str,
    metric: Metric,
    rows: usize,
    queries: usize,
    /// Full-set ground truth for the cross-check: file and the base rows it covers.
    check: (&'static str, Option<usize>),
}

fn run(a: &Args) -> Result<()> {
    println!("make_sample: {} -> {}", a.from.display(), a.to.display());
    let sets = [
        Set {
            name: "sift128",
            base: "sift128_base.bvecs",
            metric: Metric::L2,
            rows: a.sift_rows,
            queries: a.sift_queries,
            check: ("sift128_groundtruth_100000.ivecs", Some(100_000)),
        },
        Set {
            name: "minilm384",
            base: "minilm384_base.fvecs",
            metric: Metric::Cosine,
            rows: a.minilm_rows,
            queries: a.minilm_queries,
            check: ("minilm384_groundtruth.ivecs", None),
        },
    ];
    for s in &sets {
        sample(a, s)?;
    }
    let mut total = 0;
    for s in &sets {
        for f in [s.base.to_string(), format!("{}_query.fvecs", s.name), format!("{}_groundtruth.ivecs", s.name)] {
            let len = std::fs::metadata(a.to.join(&f)).map_err(|e| format!("{f}: {e}"))?.len();
            println!("  {f:<30} {len:>10} bytes");
            total += len;
        }
    }
    println!("  {:<30} {total:>10} bytes (without README.md)", "total");
    Ok(())
}

fn sample(a: &Args, s: &Set) -> Result<()> {
    let query = format!("{}_query.fvecs", s.name);
    let (src_base, src_query) = (a.from.join(s.base), a.from.join(&query));
    let (dst_base, dst_query) = (a.to.join(s.base), a.to.join(&query));

    // the cross-check first: nothing is written when the convention differs
    let t = Instant::now();
    let (gt_file, covers) = s.check;
    let covers = covers.unwrap_or(count_rows(&src_base).map_err(|e| e.to_string())?);
    let full = read(&src_base, Some(covers))?;
    let queries = read(&src_query, Some(s.queries))?;
    let ids = read_ivecs(&a.from.join(gt_file), Some(s.queries)).map_err(|e| format!("{gt_file}: {e}"))?;
    if full.len() != covers || queries.len() != s.queries || ids.len() != s.queries {
        return Err(format!("{}: the full set is smaller than expected", s.name));
    }
    let ours = exact_knn(&full.data, full.dim, &queries.data, TOP.min(ids.dim), s.metric);
    let mut same_ids = 0;
    for (q, truth) in ours.iter().enumerate() {
        for (rank, (&theirs, &(mine, d))) in ids.row(q).iter().zip(truth).enumerate() {
            let dt = operator_distance(s.metric, queries.row(q), full.row(theirs as usize));
            if (dt - d).abs() > 1e-6 * d.abs().max(1e-6) {
                return Err(format!(
                    "{gt_file}: query {q} rank {rank}: id {theirs} at distance {dt}, exact_knn finds id {mine} at {d}"
                ));
            }
            same_ids += usize::from(theirs as u32 == mine);
        }
    }
    let n = ours.len() * ids.dim.min(TOP);
    println!(
        "{}: exact_knn over {covers} rows reproduces {gt_file} for the first {} queries \
         (distances at every rank; ids {same_ids}/{n}, the rest ties) [{:.1?}]",
        s.name,
        s.queries,
        t.elapsed()
    );
    drop(full);

    let rows = copy_prefix(&src_base, &dst_base, s.rows)?;
    copy_prefix(&src_query, &dst_query, s.queries)?;
    let base = read(&dst_base, None)?;
    let queries = read(&dst_query, None)?;
    if base.len() != rows || base != read(&src_base, Some(rows))? {
        return Err(format!("{}: the copy differs from the source's first {rows} rows", dst_base.display()));
    }
    let t = Instant::now();
    let gt = exact_knn(&base.data, base.dim, &queries.data, TOP, s.metric);
    write_ivecs(&a.to.join(format!("{}_groundtruth.ivecs", s.name)), &gt)?;
    println!(
        "{}: {rows} rows x {} dims, {} queries, exact top-{TOP} by {} [{:.1?}]",
        s.name,
        base.dim,
        queries.len(),
        s.metric.name(),
        t.elapsed()
    );
    Ok(())
}

fn read(path: &Path, limit: Option<usize>) -> Result<Matrix<f32>> {
    read_vectors(path, limit).map_err(|e| e.to_string())
}

/// Copies the first `rows` rows of a vector file byte for byte (checking
/// every row's dimension on the way); returns how many it copied.
fn copy_prefix(src: &Path, dst: &Path, rows: usize) -> Result<usize> {
    let err = |e: std::io::Error| format!("{}: {e}", src.display());
    let have = count_rows(src).map_err(err)?;
    if have < rows {
        return Err(format!("{}: {have} rows, fewer than the {rows} asked for", src.display()));
    }
    let width = if src.extension().is_some_and(|e| e == "bvecs") { 1 } else { 4 };
    let mut r = std::io::BufReader::new(std::fs::File::open(src).map_err(err)?);
    let mut out = Vec::new();
    let mut dim = None;
    for i in 0..rows {
        let mut head = [0u8; 4];
        r.read_exact(&mut head).map_err(err)?;
        let d = i32::from_le_bytes(head);
        if d <= 0 || dim.is_some_and(|x| x != d) {
            return Err(format!("{}: row {i} has dimension {d}", src.display()));
        }
        dim = Some(d);
        let mut row = vec![0u8; d as usize * width];
        r.read_exact(&mut row).map_err(err)?;
        out.extend_from_slice(&head);
        out.extend_from_slice(&row);
    }
    std::fs::write(dst, &out).map_err(|e| format!("{}: {e}", dst.display()))?;
    Ok(rows)
}

/// Writes each query's neighbour ids as one .ivecs row.
fn write_ivecs(path: &Path, gt: &[Vec<(u32, f64)>]) -> Result<()> {
    let mut out = Vec::new();
    for row in gt {
        out.extend((row.len() as i32).to_le_bytes());
        for &(id, _) in row {
            out.extend((id as i32).to_le_bytes());
        }
    }
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(&out).map_err(|e| format!("{}: {e}", path.display()))
}
