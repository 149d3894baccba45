//! The data folders hold what their READMEs say: the repository's sample
//! (data/) always, the full sets (../shared/data beside the repository) when
//! they are there. The other tests take whichever folder
//! `dataset::data_dir()` picks and size themselves by it; the sizes are
//! pinned here.

use std::path::{Path, PathBuf};

use gpu_graph_engine::dataset::{count_rows, read_ivecs, read_vectors};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::recall::exact_knn;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (file, rows, dims) of each file of a folder.
fn check_sizes(dir: &Path, files: &[(&str, usize, usize)]) {
    for &(name, rows, dims) in files {
        let path = dir.join(name);
        assert_eq!(count_rows(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())), rows, "{name}");
        let dim = if name.ends_with(".ivecs") {
            read_ivecs(&path, Some(1)).unwrap().dim
        } else {
            read_vectors(&path, Some(1)).unwrap().dim
        };
        assert_eq!(dim, dims, "{name}");
    }
}

#[test]
fn the_sample_in_data() {
    let dir = repo().join("data");
    check_sizes(
        &dir,
        &[
            ("sift128_base.bvecs", 25_000, 128),
            ("sift128_query.fvecs", 200, 128),
            ("sift128_groundtruth.ivecs", 200, 100),
            ("minilm384_base.fvecs", 900, 384),
            ("minilm384_query.fvecs", 60, 384),
            ("minilm384_groundtruth.ivecs", 60, 100),
        ],
    );
    // its ground truth is the exact top-100 over its own base (ties by id),
    // checked for a few queries of each set
    for (set, base, metric) in
        [("sift128", "sift128_base.bvecs", Metric::L2), ("minilm384", "minilm384_base.fvecs", Metric::Cosine)]
    {
        let base = read_vectors(&dir.join(base), None).unwrap();
        let queries = read_vectors(&dir.join(format!("{set}_query.fvecs")), Some(3)).unwrap();
        let gt = read_ivecs(&dir.join(format!("{set}_groundtruth.ivecs")), Some(3)).unwrap();
        let exact = exact_knn(&base.data, base.dim, &queries.data, 100, metric);
        for (q, truth) in exact.iter().enumerate() {
            let ids: Vec<i32> = truth.iter().map(|&(i, _)| i as i32).collect();
            assert_eq!(gt.row(q), ids.as_slice(), "{set} query {q}");
        }
    }
}

#[test]
fn the_full_sets_beside_the_repository() {
    let dir = repo().join("../shared/data");
    if !dir.is_dir() {
        println!("no {}: nothing to check", dir.display());
        return;
    }
    check_sizes(
        &dir,
        &[
            ("sift128_base.bvecs", 500_000, 128),
            ("sift128_query.fvecs", 1_000, 128),
            ("sift128_groundtruth.ivecs", 1_000, 100),
            ("sift128_groundtruth_100000.ivecs", 1_000, 100),
            ("minilm384_base.fvecs", 61_666, 384),
            ("minilm384_query.fvecs", 1_000, 384),
            ("minilm384_groundtruth.ivecs", 1_000, 100),
        ],
    );
    // the sample's vector files are prefixes of these, byte for byte
    for name in ["sift128_base.bvecs", "sift128_query.fvecs", "minilm384_base.fvecs", "minilm384_query.fvecs"] {
        let sample = std::fs::read(repo().join("data").join(name)).unwrap();
        let mut full = vec![0u8; sample.len()];
        std::io::Read::read_exact(&mut std::fs::File::open(dir.join(name)).unwrap(), &mut full).unwrap();
        assert!(sample == full, "data/{name} is not a prefix of {}", dir.join(name).display());
    }
}
