//! gpu_graph_info(index): what the index is, how it was built, its shape,
//! and whether the search worker holds a copy of it.

use std::collections::BTreeMap;

use gpu_graph_engine::cfs::Algorithm;
use gpu_graph_engine::store::GraphView;
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};
use serde::Serialize;

use crate::storage::meta::{Meta, PHASES};
use crate::storage::page_store::PageStore;
use crate::worker::SearchInfo;

/// The jsonb gpu_graph_info() returns. Floats are f64 (an f32 widened
/// exactly), absent values null.
#[derive(Serialize)]
struct Info {
    format_version: u32,
    algorithm: &'static str,
    metric: &'static str,
    dimensions: u32,
    /// how the vector pages store coordinates: "f32" or "f16"
    storage: &'static str,
    degree: usize,
    parameters: Parameters,
    build: Build,
    nodes: Nodes,
    out_degree: OutDegree,
    entry_point: Option<u32>,
    /// inner product's pinned outliers: nodes every search starts from
    pinned: Vec<u32>,
    generation: u64,
    pages: u32,
    search: SearchInfo,
}

#[derive(Serialize)]
struct Parameters {
    s: usize,
    r: usize,
    t1: usize,
    t2: usize,
    rho: f64,
    /// a CFS graph's (absent for rnn_descent)
    #[serde(skip_serializing_if = "Option::is_none")]
    candidates: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    alpha: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lambda: Option<u32>,
}

#[derive(Serialize)]
struct Build {
    /// "cpu", "gpu", or "none" (an index built empty)
    device: &'static str,
    /// the GPU's name (a GPU build)
    gpu: Option<String>,
    /// the builder's threads (a CPU build)
    threads: Option<u32>,
    /// parallel workers that scanned the heap beside the leader
    scan_workers: u32,
    rows: u64,
    /// "<phase> ms": milliseconds of each build phase
    phases: BTreeMap<String, f64>,
    /// a build in shards (absent: built whole)
    #[serde(skip_serializing_if = "Option::is_none")]
    shards: Option<Shards>,
}

#[derive(Serialize)]
struct Shards {
    count: u32,
    largest_rows: u32,
    /// shard rows over rows (each row goes to its two nearest clusters)
    overlap: f64,
    partition_ms: f64,
    merge_ms: f64,
}

#[derive(Serialize, Default)]
struct Nodes {
    allocated: u32,
    live: u64,
    deleted: u64,
    free: u64,
}

#[derive(Serialize)]
struct OutDegree {
    mean: f64,
    min: u64,
    max: u64,
}

/// Counts the nodes by state and the out-degrees of the live ones.
fn shape(store: &PageStore, meta: &Meta) -> (Nodes, OutDegree) {
    let mut nodes = Nodes { allocated: meta.node_count, ..Nodes::default() };
    let (mut edges, mut min, mut max) = (0u64, u64::MAX, 0u64);
    let mut nb = Vec::new();
    for node in 0..meta.node_count {
        match store.visit(node, |_| 0.0) {
            None => nodes.free += 1,
            Some(v) if v.deleted => nodes.deleted += 1,
            Some(_) => {
                nodes.live += 1;
                store.neighbors(node, &mut nb);
                edges += nb.len() as u64;
                min = min.min(nb.len() as u64);
                max = max.max(nb.len() as u64);
            }
        }
    }
    let live = nodes.live;
    let mean = if live > 0 { edges as f64 / live as f64 } else { 0.0 };
    (nodes, OutDegree { mean, min: if live > 0 { min } else { 0 }, max })
}

fn build(meta: &Meta) -> Build {
    Build {
        device: match meta.build_device {
            1 => "cpu",
            2 => "gpu",
            _ => "none",
        },
        gpu: (meta.build_device == 2).then(|| meta.device_name()),
        threads: (meta.build_device == 1).then_some(meta.build_threads),
        scan_workers: meta.scan_workers,
        rows: meta.built_rows,
        phases: PHASES.iter().zip(meta.build_ms).map(|(k, v)| (format!("{k} ms"), f64::from(v))).collect(),
        shards: (meta.shards > 0).then(|| Shards {
            count: meta.shards,
            largest_rows: meta.largest_shard,
            overlap: f64::from(meta.shard_overlap),
            partition_ms: f64::from(meta.partition_ms),
            merge_ms: f64::from(meta.merge_ms),
        }),
    }
}

/// Whether the current role may see what the index says of its table's rows
/// (live count, dimensions): SELECT on the table, or the privileges of
/// pg_stat_scan_tables, as pgstattuple's pgstatindex() asks.
///
/// # Safety
/// In a transaction.
unsafe fn may_read_stats(heap: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups for the current user, in a transaction.
    unsafe {
        let user = pg_sys::GetUserId();
        pg_sys::pg_class_aclcheck(heap, user, pg_sys::ACL_SELECT as pg_sys::AclMode) == pg_sys::AclResult::ACLCHECK_OK
            || pg_sys::has_privs_of_role(user, pg_sys::Oid::from(pg_sys::ROLE_PG_STAT_SCAN_TABLES))
    }
}

#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_info(index regclass) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'gpu_graph_info_wrapper' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
")]
fn gpu_graph_info(index: pg_sys::Oid) -> JsonB {
    let lock = pg_sys::AccessShareLock as i32;
    // SAFETY: in a transaction, a gpu_graph index open (and locked) until
    // index_close.
    let (meta, (nodes, out_degree), pages, search) = unsafe {
        let rel = super::relation::open_gpu_graph_index(index, lock, "gpu_graph_info");
        let heap = (*(*rel).rd_index).indrelid;
        if !may_read_stats(heap) {
            let name = super::relation::name_of(heap);
            pg_sys::index_close(rel, lock);
            ereport!(
                ERROR,
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied for table {name}"),
                "gpu_graph_info() needs SELECT on the index's table or the privileges of pg_stat_scan_tables."
            );
        }
        let meta = Meta::read(rel);
        let shape = if meta.dim != 0 {
            shape(&PageStore::new(rel, &meta), &meta)
        } else {
            (Nodes { allocated: meta.node_count, ..Nodes::default() }, OutDegree { mean: 0.0, min: 0, max: 0 })
        };
        let pages = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        let search = crate::worker::index_info(rel);
        pg_sys::index_close(rel, lock);
        (meta, shape, pages, search)
    };
    let p = meta.params();
    let info = Info {
        format_version: meta.version,
        algorithm: super::options::ALGORITHMS.get(meta.algorithm as usize).copied().unwrap_or("unknown"),
        metric: meta.metric().name(),
        dimensions: meta.dim,
        storage: meta.element().name(),
        degree: p.degree,
        parameters: Parameters {
            s: p.s,
            r: p.r,
            t1: p.t1,
            t2: p.t2,
            rho: f64::from(p.rho),
            candidates: meta.cfs().map(|_| meta.candidates),
            alpha: match meta.cfs() {
                Some(Algorithm::Vamana { alpha } | Algorithm::Tsdg { alpha, .. }) => Some(f64::from(alpha)),
                _ => None,
            },
            lambda: match meta.cfs() {
                Some(Algorithm::Tsdg { max_lambda, .. }) => Some(max_lambda as u32),
                _ => None,
            },
        },
        build: build(&meta),
        nodes,
        out_degree,
        entry_point: meta.entry(),
        pinned: meta.pinned().collect(),
        generation: meta.generation,
        pages,
        search,
    };
    JsonB(serde_json::to_value(info).expect("gpu_graph_info: string keys only"))
}
