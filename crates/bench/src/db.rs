//! Everything the benchmark says to PostgreSQL.

use crate::args::{Args, Column};
use crate::data::Vectors;
use gpu_graph_engine::metric::Metric;
use pgvector::{HalfVector, Vector};
use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use postgres::{Client, Config, NoTls, Statement};
use std::time::{Duration, Instant};

/// The SQL operator of a metric, and the operator class on a column of
/// that type: gpu_graph's (`real_l2_ops`; for pgvector's types those of
/// gpu_graph_pgvector), which are also pgvector's HNSW class names.
pub fn operator(metric: Metric, column: Column) -> (&'static str, String) {
    let (op, name) = match metric {
        Metric::L2 => ("<->", "l2"),
        Metric::Cosine => ("<=>", "cosine"),
        Metric::InnerProduct => ("<#>", "ip"),
    };
    (op, format!("{}_{name}_ops", column.name()))
}

/// The column's SQL type for `dim` dimensions.
pub fn sql_type(column: Column, dim: usize) -> String {
    match column {
        Column::Real => "real[]".into(),
        c => format!("{}({dim})", c.name()),
    }
}

/// A query vector as a parameter of the column's type (pgvector's types
/// through the pgvector crate).
pub type Param = Box<dyn ToSql + Sync + Send>;

pub fn param(column: Column, q: &[f32]) -> Param {
    match column {
        Column::Real => Box::new(q.to_vec()),
        Column::Vector => Box::new(Vector::from(q.to_vec())),
        Column::HalfVec => Box::new(HalfVector::from_f32_slice(q)),
    }
}

/// A connection with the benchmark's session settings applied. NOTICEs
/// (the build's device and phase times) are printed when `echo_notices`.
pub fn connect(a: &Args, echo_notices: bool) -> Result<Client, String> {
    let mut cfg = Config::new();
    cfg.host(&a.host).port(a.port).dbname(&a.dbname).user(&a.user).application_name("gpu-graph-bench");
    if echo_notices {
        cfg.notice_callback(|n| println!("  {}: {}", n.severity(), n.message()));
    } else {
        cfg.notice_callback(|_| {});
    }
    let mut c = cfg.connect(NoTls).map_err(|e| {
        format!(
            "cannot connect to PostgreSQL at {} port {} (database {}, user {}): {}",
            a.host,
            a.port,
            a.dbname,
            a.user,
            pg_err(&e)
        )
    })?;
    for (name, value) in &a.sets {
        c.execute("SELECT set_config($1, $2, false)", &[name, value])
            .map_err(|e| format!("--set {name}={value}: {}", pg_err(&e)))?;
    }
    Ok(c)
}

/// The server's message (with its detail and hint) rather than the driver's
/// generic "db error".
pub fn pg_err(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let mut s = format!("{}: {}", d.severity(), d.message());
            if let Some(x) = d.detail() {
                s += &format!(" (DETAIL: {x})");
            }
            if let Some(x) = d.hint() {
                s += &format!(" (HINT: {x})");
            }
            s
        }
        None => {
            // the driver's own message is generic ("error connecting to
            // server"); the cause is in the source chain
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(x) = src {
                s += &format!(": {x}");
                src = x.source();
            }
            s
        }
    }
}

pub fn exec(c: &mut Client, sql: &str) -> Result<(), String> {
    c.batch_execute(sql).map_err(|e| format!("{sql}: {}", pg_err(&e)))
}

// around IF EXISTS, whose "does not exist, skipping" NOTICE is noise here
const QUIET_ON: &str = "SET client_min_messages = warning;";
const QUIET_OFF: &str = "RESET client_min_messages;";

/// The extensions a run needs: gpu_graph, and for pgvector's types vector
/// and gpu_graph_pgvector.
pub fn extensions(c: &mut Client, column: Column) -> Result<(), String> {
    exec(c, "CREATE EXTENSION IF NOT EXISTS gpu_graph")?;
    if column != Column::Real {
        exec(c, "CREATE EXTENSION IF NOT EXISTS vector; CREATE EXTENSION IF NOT EXISTS gpu_graph_pgvector")?;
    }
    Ok(())
}

/// (Re)creates `table(id int, embedding TYPE)` and fills it by binary COPY
/// with ids 0..n-1 in row order.
/// `storage`: the column's SET STORAGE, when not the default (extended).
pub fn load(
    c: &mut Client,
    table: &str,
    base: &Vectors,
    storage: Option<&str>,
    column: Column,
) -> Result<Duration, String> {
    let t = Instant::now();
    extensions(c, column)?;
    let ty = sql_type(column, base.dim);
    exec(
        c,
        &format!("{QUIET_ON} DROP TABLE IF EXISTS {table}; {QUIET_OFF} CREATE TABLE {table} (id int, embedding {ty})"),
    )?;
    if let Some(s) = storage {
        exec(c, &format!("ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE {s}"))?;
    }
    // pgvector's types have no fixed OID: the server says which
    let column_type = match column {
        Column::Real => Type::FLOAT4_ARRAY,
        c2 => prepare(c, &format!("SELECT $1::{}", c2.name()))?.params()[0].clone(),
    };
    let sink = c
        .copy_in(&format!("COPY {table} (id, embedding) FROM STDIN (FORMAT binary)"))
        .map_err(|e| format!("COPY: {}", pg_err(&e)))?;
    let mut w = BinaryCopyInWriter::new(sink, &[Type::INT4, column_type]);
    for i in 0..base.len() {
        let id = i as i32;
        let v = param(column, base.row(i));
        w.write(&[&id, &*v]).map_err(|e| format!("COPY row {i}: {}", pg_err(&e)))?;
    }
    w.finish().map_err(|e| format!("COPY: {}", pg_err(&e)))?;
    exec(c, &format!("ANALYZE {table}"))?;
    Ok(t.elapsed())
}

pub fn count_rows(c: &mut Client, table: &str) -> Result<usize, String> {
    let row = c
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .map_err(|e| format!("counting the rows of {table}: {}", pg_err(&e)))?;
    Ok(row.get::<_, i64>(0) as usize)
}

pub fn relation_size(c: &mut Client, rel: &str) -> Result<i64, String> {
    let row = c
        .query_one("SELECT pg_relation_size($1::text::regclass)", &[&rel])
        .map_err(|e| format!("pg_relation_size({rel}): {}", pg_err(&e)))?;
    Ok(row.get(0))
}

/// CREATE EXTENSION if needed, then (re)builds the index with access method
/// `am` (gpu_graph, or hnsw); returns its wall time.
pub fn build(
    c: &mut Client,
    table: &str,
    index: &str,
    am: &str,
    opclass: &str,
    options: Option<&str>,
) -> Result<Duration, String> {
    exec(c, "CREATE EXTENSION IF NOT EXISTS gpu_graph")?;
    exec(c, &format!("{QUIET_ON} DROP INDEX IF EXISTS {index}; {QUIET_OFF}"))?;
    let with = options.map(|o| format!(" WITH ({o})")).unwrap_or_default();
    let sql = format!("CREATE INDEX {index} ON {table} USING {am} (embedding {opclass}){with}");
    println!("{sql}");
    // the build's report (device, phase times) is a DEBUG1 message
    exec(c, "SET client_min_messages = debug1")?;
    let t = Instant::now();
    let built = exec(c, &sql);
    let took = t.elapsed();
    exec(c, QUIET_OFF)?;
    built.map(|_| took)
}

/// The setting that widens a search: gpu_graph's, or pgvector HNSW's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EfSetting {
    GpuGraph,
    Hnsw,
}

impl EfSetting {
    pub fn name(self) -> &'static str {
        match self {
            EfSetting::GpuGraph => "gpu_graph.ef_search",
            EfSetting::Hnsw => "hnsw.ef_search",
        }
    }
}

/// Sets the ef_search setting (None: the server's default) and returns the
/// value in force.
pub fn set_ef(c: &mut Client, setting: EfSetting, ef: Option<u32>) -> Result<String, String> {
    // A session loads an extension's library at its first call into it;
    // before that, its settings are placeholders and SHOW after RESET says "".
    exec(
        c,
        match setting {
            EfSetting::GpuGraph => "SELECT l2_distance('{0}'::real[], '{0}'::real[])",
            EfSetting::Hnsw => "SELECT '[1]'::vector",
        },
    )?;
    let name = setting.name();
    match ef {
        Some(v) => exec(c, &format!("SET {name} = {v}"))?,
        None => exec(c, &format!("RESET {name}"))?,
    }
    let row = c.query_one(&format!("SHOW {name}"), &[]).map_err(|e| format!("SHOW {name}: {}", pg_err(&e)))?;
    Ok(row.get(0))
}

pub fn knn_sql(table: &str, op: &str, k: usize, column: Column) -> String {
    let ty = if column == Column::Real { "real[]" } else { column.name() };
    format!("SELECT id, embedding {op} $1::{ty} AS d FROM {table} ORDER BY embedding {op} $1::{ty} LIMIT {k}")
}

pub fn prepare(c: &mut Client, sql: &str) -> Result<Statement, String> {
    c.prepare(sql).map_err(|e| format!("{sql}: {}", pg_err(&e)))
}

/// The rows one query returned: (id, distance), in the server's order.
pub type Answer = Vec<(i32, f64)>;

/// One query: its answer and its latency.
pub fn run_query(c: &mut Client, st: &Statement, q: &Param) -> Result<(Answer, Duration), String> {
    let t = Instant::now();
    let rows = c.query(st, &[&**q]).map_err(|e| format!("query: {}", pg_err(&e)))?;
    let dt = t.elapsed();
    let out = rows
        .iter()
        .map(|r| {
            let d: Option<f64> = r.try_get::<_, f64>(1).ok().or_else(|| r.try_get::<_, f32>(1).ok().map(f64::from));
            (r.get::<_, i32>(0), d.unwrap_or(f64::NAN))
        })
        .collect();
    Ok((out, dt))
}

/// One gpu_graph_search_batch call over `index`, its rows joined back to
/// `table` for their ids, in query and rank order; $1 is the queries as
/// the text of a two-dimensional real[].
pub fn batch_sql(table: &str, index: &str, k: usize) -> String {
    format!(
        "SELECT r.query, t.id, r.distance::float8 FROM gpu_graph_search_batch('{index}'::regclass, $1::text::real[], {k}) r \
         JOIN {table} t ON t.ctid = r.ctid ORDER BY r.query, r.rank"
    )
}

/// `n` queries (`dim` values each, row after row) in one batch call: each
/// query's answer, and the call's latency.
pub fn run_batch(
    c: &mut Client,
    st: &Statement,
    rows: &[f32],
    dim: usize,
    n: usize,
) -> Result<(Vec<Answer>, Duration), String> {
    let mut text = String::with_capacity(rows.len() * 12 + 2 * n + 2);
    text.push('{');
    for (i, q) in rows.chunks_exact(dim).enumerate() {
        text.push_str(if i == 0 { "{" } else { ",{" });
        for (j, x) in q.iter().enumerate() {
            if j > 0 {
                text.push(',');
            }
            text.push_str(&x.to_string());
        }
        text.push('}');
    }
    text.push('}');
    let t = Instant::now();
    let found = c.query(st, &[&text]).map_err(|e| format!("batch: {}", pg_err(&e)))?;
    let dt = t.elapsed();
    let mut out: Vec<Answer> = vec![Vec::new(); n];
    for r in found {
        let q: i32 = r.get(0);
        out[(q - 1) as usize].push((r.get::<_, i32>(1), r.get::<_, f64>(2)));
    }
    Ok((out, dt))
}

/// The plan of one k-NN query, for a line saying whether the index serves it.
pub fn explain(c: &mut Client, sql: &str, q: &Param) -> Result<Vec<String>, String> {
    let rows =
        c.query(&format!("EXPLAIN (COSTS OFF) {sql}"), &[&**q]).map_err(|e| format!("EXPLAIN: {}", pg_err(&e)))?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
}

/// Whether row `id` is in the share `f` that `--delete-fraction` deletes
/// (a multiplicative hash, so the choice is spread and repeatable).
pub fn in_deleted_share(id: usize, f: f64) -> bool {
    ((id as u64).wrapping_mul(2_654_435_761) % 1_000_000) < (f * 1_000_000.0) as u64
}

/// Deletes that share of the rows and VACUUMs; returns the deleted ids.
pub fn delete_share(
    c: &mut Client,
    table: &str,
    f: f64,
    rows: usize,
) -> Result<std::collections::HashSet<i32>, String> {
    let cut = (f * 1_000_000.0) as i64;
    // two statements: a multi-statement string runs as one transaction,
    // where VACUUM is not allowed
    c.batch_execute(&format!("DELETE FROM {table} WHERE (id::bigint * 2654435761) % 1000000 < {cut}"))
        .map_err(|e| format!("DELETE: {e}"))?;
    c.batch_execute(&format!("VACUUM {table}")).map_err(|e| format!("VACUUM: {e}"))?;
    Ok((0..rows).filter(|&i| in_deleted_share(i, f)).map(|i| i as i32).collect())
}

/// What waiting for the search worker found.
pub enum WorkerWait {
    /// no worker is registered, or this session does not ask it
    NotAsked,
    /// it answered a scan of the index after this long
    Answered(Duration),
    /// it answered none in the time given (the sweep then times whatever serves the scans)
    NoAnswer(Duration),
}

/// Where a search worker is registered (running, or starting: "absent") and
/// this session asks it, waits until it answers a scan of the index (up to
/// `limit`), so that the sweep does not time the CPU fallbacks of a worker
/// still compiling its kernels or loading its copy (seconds for a 1M x 768
/// index).
pub fn wait_for_worker(c: &mut Client, sql: &str, q: &Param, limit: Duration) -> Result<WorkerWait, String> {
    let row = c
        .query_one(
            "SELECT coalesce(gpu_graph_worker_stats() #>> '{worker,state}', ''), \
                    current_setting('gpu_graph.search_device')",
            &[],
        )
        .map_err(|e| format!("gpu_graph_worker_stats(): {}", pg_err(&e)))?;
    let (state, device): (String, String) = (row.get(0), row.get(1));
    if !matches!(state.as_str(), "running" | "absent") || device == "cpu" {
        return Ok(WorkerWait::NotAsked);
    }
    let served = |c: &mut Client| -> Result<i64, String> {
        c.query_one("SELECT (gpu_graph_worker_stats() #>> '{scans,worker}')::bigint", &[])
            .map(|r| r.get(0))
            .map_err(|e| format!("gpu_graph_worker_stats(): {}", pg_err(&e)))
    };
    let st = prepare(c, sql)?;
    let t = Instant::now();
    while t.elapsed() < limit {
        let before = served(c)?;
        run_query(c, &st, q)?;
        if served(c)? > before {
            return Ok(WorkerWait::Answered(t.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(WorkerWait::NoAnswer(limit))
}
