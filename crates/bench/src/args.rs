//! Command line of gpu-graph-bench (hand-rolled: a dozen flags do not need a
//! parser crate).

use gpu_graph_engine::metric::Metric;
use std::path::PathBuf;

pub const USAGE: &str = "\
gpu-graph-bench: load a dataset into PostgreSQL through SQL, build a gpu_graph
index on it, sweep gpu_graph.ef_search, and report recall@k, queries/s and
latency (single client unless --clients).

usage: gpu-graph-bench --dataset sift128|minilm384 [options]
       gpu-graph-bench --base FILE --query FILE [--gt FILE] --metric l2|cosine|ip [options]

data
  --dataset NAME        a set in the data folder (see the folder's README.md)
  --data DIR            the data folder (default: $GPU_GRAPH_DATA, else
                        ../shared/data beside the repository when it exists,
                        else the repository's data/, a small sample)
  --base/--query/--gt FILE   .fvecs/.bvecs base and queries, .ivecs ground truth
                        over the whole base file (instead of --dataset)
  --metric l2|cosine|ip the operator and operator class (required with --base;
                        with --dataset another metric than the set's gets
                        brute-force ground truth)
  --rows N              load the first N base rows (default: all; a file
                        with fewer rows is loaded whole, and a note says so)
  --queries N           run the first N queries (default: all; likewise)
  -k N                  LIMIT and recall@k (default 10)

index and sweep
  --ef LIST             gpu_graph.ef_search values, comma separated, or
                        `default` for the server's setting (default 10,20,40,80,160)
  --index-options TEXT  what goes inside CREATE INDEX ... WITH (TEXT)
  --set NAME=VALUE      a session setting for every connection (repeatable),
                        e.g. --set maintenance_work_mem=4GB
  --clients N           concurrent client connections (default 1)
  --warmup N            untimed queries before each ef_search (default 50)
  --examples N          print the answers to the first N queries (default 0)
  --table NAME          table name (default items); the index is NAME_embedding_idx
  --skip-load           reuse the loaded table (its row count must equal --rows)
  --skip-build          reuse the built index too
  --load-only           load the table (COPY + ANALYZE) and stop
  --column-storage S    ALTER COLUMN embedding SET STORAGE S (plain, main,
                        external, extended) before the load
  --column TYPE         the column's type: real (real[], the default), vector
                        or halfvec (pgvector's; needs pgvector and the
                        gpu_graph_pgvector extension installed)
  --compare hnsw        then pgvector's HNSW on the same column (vector or
                        halfvec): its build and the same sweep of
                        hnsw.ef_search, reported beside gpu_graph's
  --hnsw-options TEXT   WITH (TEXT) of the HNSW build (default m = 16,
                        ef_construction = 64)
  --batch N             gpu_graph's sweep through gpu_graph_search_batch, N
                        queries a call (the clients share the calls; the
                        latency columns are per call); HNSW's stays one
                        query a statement
  --delete-fraction F   after the build, DELETE a pseudo-random share F of the
                        rows and VACUUM; recall is then measured against the
                        exact neighbours among the remaining rows, and any
                        deleted row returned is an error
  --csv FILE            write the results as CSV (with --compare, also a
                        chart of recall against queries/s of both: FILE
                        with .svg for its extension)

connection (defaults from PGHOST, PGPORT, PGDATABASE, PGUSER)
  --host DIR|NAME  --port N  --dbname NAME  --user NAME
";

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ef {
    /// The server's gpu_graph.ef_search (RESET, then SHOW).
    Default,
    Value(u32),
}

/// The type of the benchmark table's vector column.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Column {
    Real,
    Vector,
    HalfVec,
}

impl Column {
    /// The operator class prefix, and what pgvector calls the type.
    pub fn name(self) -> &'static str {
        match self {
            Column::Real => "real",
            Column::Vector => "vector",
            Column::HalfVec => "halfvec",
        }
    }
}

#[derive(Debug)]
pub struct Args {
    pub dataset: Option<String>,
    pub data_dir: PathBuf,
    pub base: Option<PathBuf>,
    pub query: Option<PathBuf>,
    pub gt: Option<PathBuf>,
    pub metric: Option<Metric>,
    pub rows: Option<usize>,
    pub queries: Option<usize>,
    pub k: usize,
    pub ef: Vec<Ef>,
    pub index_options: Option<String>,
    pub sets: Vec<(String, String)>,
    pub clients: usize,
    pub warmup: usize,
    pub examples: usize,
    pub table: String,
    pub skip_load: bool,
    pub skip_build: bool,
    pub load_only: bool,
    pub column_storage: Option<String>,
    pub column: Column,
    pub compare_hnsw: bool,
    pub hnsw_options: String,
    pub delete_fraction: Option<f64>,
    pub batch: Option<usize>,
    pub csv: Option<PathBuf>,
    pub host: String,
    pub port: u16,
    pub dbname: String,
    pub user: String,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

pub fn parse_metric(s: &str) -> Result<Metric, String> {
    match s {
        "l2" => Ok(Metric::L2),
        "cosine" => Ok(Metric::Cosine),
        "ip" | "inner_product" => Ok(Metric::InnerProduct),
        _ => Err(format!("--metric: expected l2, cosine or ip, got `{s}`")),
    }
}

pub fn parse_ef_list(s: &str) -> Result<Vec<Ef>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part == "default" {
            out.push(Ef::Default);
        } else {
            let v: u32 = part.parse().map_err(|_| format!("--ef: `{part}` is not a number or `default`"))?;
            out.push(Ef::Value(v));
        }
    }
    if out.is_empty() {
        return Err("--ef: empty list".into());
    }
    Ok(out)
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: `{v}` is not a valid number"))
}

/// Parses `argv` (without the program name). `Ok(None)` means --help.
pub fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let user = env_or("PGUSER", "postgres");
    let mut a = Args {
        dataset: None,
        data_dir: gpu_graph_engine::dataset::data_dir(),
        base: None,
        query: None,
        gt: None,
        metric: None,
        rows: None,
        queries: None,
        k: 10,
        ef: parse_ef_list("10,20,40,80,160")?,
        index_options: None,
        sets: Vec::new(),
        clients: 1,
        warmup: 50,
        examples: 0,
        table: "items".into(),
        skip_load: false,
        skip_build: false,
        load_only: false,
        column_storage: None,
        column: Column::Real,
        compare_hnsw: false,
        hnsw_options: "m = 16, ef_construction = 64".into(),
        delete_fraction: None,
        batch: None,
        csv: None,
        host: env_or("PGHOST", "/var/run/postgresql"),
        port: number("PGPORT", &env_or("PGPORT", "5432"))?,
        dbname: env_or("PGDATABASE", &user),
        user,
    };
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let flag = flag.as_str();
        // flags without a value
        match flag {
            "-h" | "--help" => return Ok(None),
            "--skip-load" => {
                a.skip_load = true;
                continue;
            }
            "--load-only" => {
                a.load_only = true;
                continue;
            }
            "--skip-build" => {
                a.skip_build = true;
                a.skip_load = true;
                continue;
            }
            _ => {}
        }
        let v = it.next().ok_or_else(|| format!("{flag}: missing value (see --help)"))?.as_str();
        match flag {
            "--dataset" => a.dataset = Some(v.into()),
            "--column-storage" => a.column_storage = Some(v.into()),
            "--column" => {
                a.column = match v {
                    "real" => Column::Real,
                    "vector" => Column::Vector,
                    "halfvec" => Column::HalfVec,
                    _ => return Err(format!("--column: expected real, vector or halfvec, got `{v}`")),
                }
            }
            "--compare" if v == "hnsw" => a.compare_hnsw = true,
            "--compare" => return Err(format!("--compare: only `hnsw` is known, got `{v}`")),
            "--hnsw-options" => a.hnsw_options = v.into(),
            "--data" => a.data_dir = v.into(),
            "--base" => a.base = Some(v.into()),
            "--query" => a.query = Some(v.into()),
            "--gt" => a.gt = Some(v.into()),
            "--metric" => a.metric = Some(parse_metric(v)?),
            "--rows" => a.rows = Some(number(flag, v)?),
            "--queries" => a.queries = Some(number(flag, v)?),
            "-k" | "--k" => a.k = number(flag, v)?,
            "--ef" => a.ef = parse_ef_list(v)?,
            "--index-options" => a.index_options = Some(v.into()).filter(|s: &String| !s.trim().is_empty()),
            "--set" => {
                let (name, value) =
                    v.split_once('=').ok_or_else(|| format!("--set: expected NAME=VALUE, got `{v}`"))?;
                a.sets.push((name.trim().into(), value.trim().into()));
            }
            "--clients" => a.clients = number(flag, v)?,
            "--warmup" => a.warmup = number(flag, v)?,
            "--examples" => a.examples = number(flag, v)?,
            "--table" => a.table = v.into(),
            "--csv" => a.csv = Some(v.into()),
            "--delete-fraction" => {
                let f: f64 = v.parse().map_err(|_| format!("--delete-fraction: not a number: `{v}`"))?;
                if !(0.0..1.0).contains(&f) {
                    return Err("--delete-fraction must be in [0, 1)".into());
                }
                a.delete_fraction = Some(f);
            }
            "--batch" => {
                let n: usize = number(flag, v)?;
                if n == 0 {
                    return Err("--batch must be at least 1".into());
                }
                a.batch = Some(n);
            }
            "--host" => a.host = v.into(),
            "--port" => a.port = number(flag, v)?,
            "--dbname" => a.dbname = v.into(),
            "--user" => a.user = v.into(),
            _ => return Err(format!("unknown option `{flag}` (see --help)")),
        }
    }
    if a.dataset.is_some() == a.base.is_some() {
        return Err("give either --dataset NAME or --base FILE (see --help)".into());
    }
    if a.base.is_some() && (a.query.is_none() || a.metric.is_none()) {
        return Err("--base needs --query and --metric".into());
    }
    if a.k == 0 || a.clients == 0 {
        return Err("-k and --clients must be at least 1".into());
    }
    if !a.table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || a.table.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("--table: `{}` is not a plain SQL identifier", a.table));
    }
    if a.compare_hnsw && a.column == Column::Real {
        return Err("--compare hnsw needs a pgvector column: --column vector or halfvec".into());
    }
    if a.compare_hnsw && a.delete_fraction.is_some() {
        return Err("--compare hnsw and --delete-fraction do not go together".into());
    }
    if matches!(a.rows, Some(0)) || matches!(a.queries, Some(0)) {
        return Err("--rows and --queries must be at least 1".into());
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_a_typical_line() {
        let a = parse(&argv(
            "--dataset sift128 --rows 100000 --ef 10,default,40 --index-options degree=32 --set a.b=1 --port 7 --skip-build",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(a.dataset.as_deref(), Some("sift128"));
        assert_eq!(a.rows, Some(100000));
        assert_eq!(a.ef, vec![Ef::Value(10), Ef::Default, Ef::Value(40)]);
        assert_eq!(a.index_options.as_deref(), Some("degree=32"));
        assert_eq!(a.sets, vec![("a.b".to_string(), "1".to_string())]);
        assert_eq!(a.port, 7);
        assert!(a.skip_load && a.skip_build);
    }

    #[test]
    fn rejects_bad_input() {
        assert!(parse(&argv("")).is_err());
        assert!(parse(&argv("--dataset x --base y")).is_err());
        assert!(parse(&argv("--base b --query q")).is_err());
        assert!(parse(&argv("--dataset x --ef 1,two")).is_err());
        assert!(parse(&argv("--dataset x --rows")).is_err());
        assert!(parse(&argv("--dataset x --table a;b")).is_err());
        assert!(parse(&argv("--dataset x --bogus 1")).is_err());
        assert!(parse(&argv("--dataset x --column text")).is_err());
        assert!(parse(&argv("--dataset x --compare hnsw")).is_err());
        assert!(parse(&argv("--dataset x --column vector --compare ivf")).is_err());
        let a = parse(&argv("--dataset x --column halfvec --compare hnsw")).unwrap().unwrap();
        assert!(a.column == Column::HalfVec && a.compare_hnsw);
        assert!(parse(&argv("--help")).unwrap().is_none());
    }
}
