//! Which files a benchmark reads, and the exact ground truth it scores against.

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::{dataset, recall};
use std::path::{Path, PathBuf};

/// A ground-truth file and how many leading base rows it was computed over.
pub struct GtFile {
    pub path: PathBuf,
    pub covers: Option<usize>, // None: the whole base file
}

pub struct Spec {
    pub name: String,
    pub base: PathBuf,
    pub query: PathBuf,
    pub metric: Metric,
    pub gt: Vec<GtFile>,
}

/// One query's exact neighbours: (row, operator distance), nearest first.
pub type Truth = Vec<(u32, f64)>;

/// The sets of a data folder: the full sets (../shared/data beside the
/// repository) or the repository's sample (data/), which uses the same file
/// names; see each folder's README.md.
pub fn known(name: &str, dir: &Path) -> Result<Spec, String> {
    let f = |s: &str| dir.join(s);
    match name {
        "sift128" => Ok(Spec {
            name: name.into(),
            base: f("sift128_base.bvecs"),
            query: f("sift128_query.fvecs"),
            metric: Metric::L2,
            gt: vec![
                GtFile { path: f("sift128_groundtruth_100000.ivecs"), covers: Some(100_000) },
                GtFile { path: f("sift128_groundtruth.ivecs"), covers: None },
            ],
        }),
        "minilm384" => Ok(Spec {
            name: name.into(),
            base: f("minilm384_base.fvecs"),
            query: f("minilm384_query.fvecs"),
            metric: Metric::Cosine,
            gt: vec![GtFile { path: f("minilm384_groundtruth.ivecs"), covers: None }],
        }),
        _ => Err(format!("unknown dataset `{name}` (known: sift128, minilm384; or use --base/--query/--metric)")),
    }
}

/// Row-major f32 vectors (.bvecs values widened).
pub type Vectors = dataset::Matrix<f32>;

/// Reads at most `limit` rows of an .fvecs or .bvecs file.
pub fn read_vectors(path: &Path, limit: Option<usize>) -> Result<Vectors, String> {
    let m = dataset::read_vectors(path, limit).map_err(|e| e.to_string())?;
    if m.is_empty() {
        return Err(format!("{}: no vectors", path.display()));
    }
    Ok(m)
}

/// Rows in an .fvecs/.bvecs file, from its size (each row: a 4-byte dimension
/// and `dim` values).
pub fn rows_in_file(path: &Path) -> Result<usize, String> {
    dataset::count_rows(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// For each query, its `k` exact nearest neighbours among the first `rows`
/// base rows as (row, operator distance), nearest first, and where they came
/// from. Distances are always computed here from the vectors.
///
/// A ground-truth file over N ≥ rows rows serves a prefix of `rows` rows when,
/// for every query, at least k of its listed ids are < rows: any prefix row
/// missing from the list is no nearer than every listed one, so the listed
/// prefix ids are the prefix's own nearest neighbours. Otherwise the ground
/// truth is computed by brute force.
pub fn ground_truth(
    spec: &Spec,
    base: &Vectors,
    base_rows_in_file: usize,
    queries: &Vectors,
    k: usize,
) -> Result<(Vec<Truth>, String), String> {
    let rows = base.len();
    let mut files: Vec<(&GtFile, usize)> = spec
        .gt
        .iter()
        .map(|g| (g, g.covers.unwrap_or(base_rows_in_file)))
        .filter(|(g, covers)| *covers >= rows && g.path.exists())
        .collect();
    files.sort_by_key(|(_, covers)| *covers);
    for (g, covers) in files {
        let ids =
            dataset::read_ivecs(&g.path, Some(queries.len())).map_err(|e| format!("{}: {e}", g.path.display()))?;
        if ids.len() < queries.len() {
            return Err(format!("{}: fewer rows than queries", g.path.display()));
        }
        let mut gt = Vec::with_capacity(queries.len());
        for q in 0..queries.len() {
            let kept: Vec<(u32, f64)> = ids
                .row(q)
                .iter()
                .filter(|&&i| i >= 0 && (i as usize) < rows)
                .take(k)
                .map(|&i| (i as u32, recall::operator_distance(spec.metric, queries.row(q), base.row(i as usize))))
                .collect();
            if kept.len() < k {
                break;
            }
            gt.push(kept);
        }
        if gt.len() == queries.len() {
            let how = if covers == rows {
                format!("{}", g.path.display())
            } else {
                format!("{} (over {covers} rows, restricted to the first {rows})", g.path.display())
            };
            return Ok((gt, how));
        }
    }
    println!("computing exact ground truth by brute force ({rows} rows × {} queries)...", queries.len());
    let gt = recall::exact_knn(&base.data, base.dim, &queries.data, k, spec.metric);
    Ok((gt, "brute force (exact)".into()))
}

/// Exact top-k among the rows not in `deleted`, with the rows' own ids.
pub fn ground_truth_without(
    base: &Vectors,
    deleted: &std::collections::HashSet<i32>,
    queries: &Vectors,
    metric: Metric,
    k: usize,
) -> Vec<Truth> {
    let keep: Vec<usize> = (0..base.len()).filter(|&i| !deleted.contains(&(i as i32))).collect();
    let mut rows = Vec::with_capacity(keep.len() * base.dim);
    for &i in &keep {
        rows.extend_from_slice(base.row(i));
    }
    recall::exact_knn(&rows, base.dim, &queries.data, k, metric)
        .into_iter()
        .map(|t| t.into_iter().map(|(j, d)| (keep[j as usize] as u32, d)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whichever folder the rule picks (the full sets or the sample), the
    /// ground truth for a prefix equals brute force over that prefix.
    #[test]
    fn ground_truth_is_exact_for_a_prefix() {
        let spec = known("sift128", &dataset::data_dir()).unwrap();
        let in_file = rows_in_file(&spec.base).unwrap();
        let queries = read_vectors(&spec.query, Some(20)).unwrap();
        for rows in [2_000, in_file.min(25_000)] {
            let base = read_vectors(&spec.base, Some(rows)).unwrap();
            let (gt, how) = ground_truth(&spec, &base, in_file, &queries, 10).unwrap();
            let exact = recall::exact_knn(&base.data, base.dim, &queries.data, 10, spec.metric);
            for (q, (g, e)) in gt.iter().zip(&exact).enumerate() {
                let d = |t: &Truth| t.iter().map(|x| x.1).collect::<Vec<_>>();
                assert_eq!(d(g), d(e), "{rows} rows, query {q}, ground truth from {how}");
            }
        }
    }
}
