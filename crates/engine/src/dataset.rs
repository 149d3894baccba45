//! Readers for the texmex formats (.fvecs, .bvecs, .ivecs): per row a
//! little-endian i32 dimension, then that many values (f32, u8 or i32).

use std::fs::File;
use std::io::{self, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};

/// Rows of equal length, stored contiguously.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix<T> {
    pub dim: usize,
    pub data: Vec<T>,
}

impl<T> Matrix<T> {
    pub fn len(&self) -> usize {
        self.data.len().checked_div(self.dim).unwrap_or(0)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// Reads a `.fvecs` file, at most `limit` rows.
pub fn read_fvecs(path: &Path, limit: Option<usize>) -> io::Result<Matrix<f32>> {
    read_vecs(path, limit, 4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads a `.bvecs` file (u8 values, as SIFT's), widened to f32.
pub fn read_bvecs(path: &Path, limit: Option<usize>) -> io::Result<Matrix<f32>> {
    read_vecs(path, limit, 1, |b| b[0] as f32)
}

/// Reads base or query vectors by the file's extension: `.bvecs`, else `.fvecs`.
pub fn read_vectors(path: &Path, limit: Option<usize>) -> io::Result<Matrix<f32>> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("bvecs") => read_bvecs(path, limit),
        Some("fvecs") => read_fvecs(path, limit),
        _ => Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{}: expected a .fvecs or .bvecs file", path.display()),
        )),
    }
}

/// Reads a `.ivecs` file (ground-truth ids).
pub fn read_ivecs(path: &Path, limit: Option<usize>) -> io::Result<Matrix<i32>> {
    read_vecs(path, limit, 4, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn read_vecs<T>(path: &Path, limit: Option<usize>, width: usize, decode: impl Fn(&[u8]) -> T) -> io::Result<Matrix<T>> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let bad = |msg: String| io::Error::new(ErrorKind::InvalidData, format!("{}: {msg}", path.display()));
    let mut out = Matrix { dim: 0, data: Vec::new() };
    let mut row = Vec::new();
    let mut rows = 0usize;
    while limit.is_none_or(|l| rows < l) {
        let mut head = [0u8; 4];
        match r.read_exact(&mut head) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
            other => other?,
        }
        let dim = i32::from_le_bytes(head);
        if dim <= 0 || (rows > 0 && dim as usize != out.dim) {
            return Err(bad(format!("row {rows} has dimension {dim}")));
        }
        out.dim = dim as usize;
        row.resize(out.dim * width, 0);
        r.read_exact(&mut row).map_err(|e| bad(format!("row {rows}: {e}")))?;
        out.data.extend(row.chunks_exact(width).map(&decode));
        rows += 1;
    }
    Ok(out)
}

/// Rows in a `.fvecs`, `.bvecs` or `.ivecs` file, from its first row's
/// dimension and its size (0 for an empty file), without reading the rest.
/// A size that is not a whole number of rows is an error.
pub fn count_rows(path: &Path) -> io::Result<usize> {
    let width = match path.extension().and_then(|e| e.to_str()) {
        Some("bvecs") => 1,
        Some("fvecs" | "ivecs") => 4,
        _ => {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("{}: expected a .fvecs, .bvecs or .ivecs file", path.display()),
            ))
        }
    };
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let mut head = [0u8; 4];
    f.read_exact(&mut head).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let dim = i32::from_le_bytes(head);
    let row = 4 + dim.max(0) as u64 * width;
    if dim <= 0 || len % row != 0 {
        return Err(io::Error::new(
            ErrorKind::InvalidData,
            format!("{}: {len} bytes is not a whole number of rows of dimension {dim}", path.display()),
        ));
    }
    Ok((len / row) as usize)
}

/// Where the benchmark and test data sets lie: `$GPU_GRAPH_DATA` when it is
/// set (and not empty); else `../shared/data` beside the repository when
/// that folder exists (the full sets); else the repository's own `data/` (a
/// prefix of each set, committed; see data/README.md). scripts/lib.sh applies
/// the same rule.
pub fn data_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = resolve_data_dir(std::env::var_os("GPU_GRAPH_DATA"), &root);
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// The rule of [`data_dir`] for a given `GPU_GRAPH_DATA` and repository root.
fn resolve_data_dir(env: Option<std::ffi::OsString>, root: &Path) -> PathBuf {
    if let Some(dir) = env.filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let shared = root.join("../shared/data");
    if shared.is_dir() {
        shared
    } else {
        root.join("data")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!("gpu_graph_dataset_{}_{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn formats_and_limit() {
        let mut f = Vec::new();
        for row in [[1.5f32, -2.0], [3.0, 4.25], [0.0, 1.0]] {
            f.extend(2i32.to_le_bytes());
            row.iter().for_each(|x| f.extend(x.to_le_bytes()));
        }
        let p = write("a.fvecs", &f);
        let m = read_fvecs(&p, None).unwrap();
        assert_eq!((m.dim, m.len()), (2, 3));
        assert_eq!(m.row(1), &[3.0, 4.25]);
        assert_eq!(read_fvecs(&p, Some(2)).unwrap().data, vec![1.5, -2.0, 3.0, 4.25]);
        // a truncated last row is an error, not a silent short read
        let p2 = write("b.fvecs", &f[..f.len() - 2]);
        assert!(read_fvecs(&p2, None).is_err());

        let b = [3i32.to_le_bytes().as_slice(), &[0, 128, 255]].concat();
        let p3 = write("c.bvecs", &b);
        assert_eq!(read_bvecs(&p3, None).unwrap().data, vec![0.0, 128.0, 255.0]);

        let i = [1i32.to_le_bytes(), 7i32.to_le_bytes(), 1i32.to_le_bytes(), (-1i32).to_le_bytes()].concat();
        let p4 = write("d.ivecs", &i);
        assert_eq!(read_ivecs(&p4, None).unwrap().data, vec![7, -1]);
        for p in [p, p2, p3, p4] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn count_rows_from_the_size() {
        let mut f = Vec::new();
        for row in [[1u8, 2, 3], [4, 5, 6]] {
            f.extend(3i32.to_le_bytes());
            f.extend(row);
        }
        let p = write("e.bvecs", &f);
        assert_eq!(count_rows(&p).unwrap(), 2);
        let p2 = write("f.bvecs", &f[..f.len() - 1]);
        assert!(count_rows(&p2).is_err(), "a partial last row");
        let p3 = write("g.ivecs", &[]);
        assert_eq!(count_rows(&p3).unwrap(), 0);
        let p4 = write("h.fvecs", &[2i32.to_le_bytes(), 1f32.to_le_bytes(), 2f32.to_le_bytes()].concat());
        assert_eq!(count_rows(&p4).unwrap(), 1);
        assert!(count_rows(Path::new("x.txt")).is_err());
        for p in [p, p2, p3, p4] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn data_dir_rule() {
        let t = std::env::temp_dir().join(format!("gpu_graph_dataset_{}_rule", std::process::id()));
        let root = t.join("repo");
        std::fs::create_dir_all(&root).unwrap();
        // no ../shared/data beside the repository: its own data/
        assert_eq!(resolve_data_dir(None, &root), root.join("data"));
        // an empty variable counts as unset, as in the shell's ${VAR:-...}
        assert_eq!(resolve_data_dir(Some("".into()), &root), root.join("data"));
        std::fs::create_dir_all(t.join("shared/data")).unwrap();
        assert_eq!(resolve_data_dir(None, &root), root.join("../shared/data"));
        assert_eq!(resolve_data_dir(Some("/elsewhere".into()), &root), PathBuf::from("/elsewhere"));
        std::fs::remove_dir_all(&t).unwrap();
    }

    /// The folder the rule picks holds the SIFT set (base, queries and the
    /// ground truth over the whole base), whichever folder that is.
    #[test]
    fn data_dir_holds_the_sets() {
        let dir = data_dir();
        for f in ["sift128_base.bvecs", "sift128_query.fvecs", "sift128_groundtruth.ivecs"] {
            assert!(dir.join(f).is_file(), "no {f} in {}", dir.display());
        }
    }
}
