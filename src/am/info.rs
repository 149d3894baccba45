//! gpu_graph_info(index): what the index is, how it was built, its shape,
//! and whether the search worker holds a copy of it.

use gpu_graph_engine::store::GraphView;
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB};
use serde_json::json;

use crate::storage::meta::{Meta, PHASES};
use crate::storage::page_store::PageStore;

#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_info(index regclass) RETURNS jsonb
    AS 'MODULE_PATHNAME', 'gpu_graph_info_wrapper' LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
")]
fn gpu_graph_info(index: pg_sys::Oid) -> JsonB {
    unsafe {
        let rel = pg_sys::index_open(index, pg_sys::AccessShareLock as i32);
        let ours = pg_sys::get_am_oid(c"gpu_graph".as_ptr(), false);
        if (*(*rel).rd_rel).relam != ours {
            pg_sys::index_close(rel, pg_sys::AccessShareLock as i32);
            error!("gpu_graph_info: relation {} is not a gpu_graph index", index.to_u32());
        }
        let meta = Meta::read(rel);
        let (mut live, mut deleted, mut free, mut edges, mut min_deg, mut max_deg) =
            (0u64, 0u64, 0u64, 0u64, u64::MAX, 0u64);
        if meta.dim != 0 {
            let store = PageStore::new(rel, &meta);
            let mut nb = Vec::new();
            for node in 0..meta.node_count {
                match store.visit(node, |_| 0.0) {
                    None => free += 1,
                    Some(v) if v.deleted => deleted += 1,
                    Some(_) => {
                        live += 1;
                        store.neighbors(node, &mut nb);
                        edges += nb.len() as u64;
                        min_deg = min_deg.min(nb.len() as u64);
                        max_deg = max_deg.max(nb.len() as u64);
                    }
                }
            }
        }
        let blocks = pg_sys::RelationGetNumberOfBlocksInFork(rel, pg_sys::ForkNumber::MAIN_FORKNUM);
        let search = crate::worker::index_info(rel);
        pg_sys::index_close(rel, pg_sys::AccessShareLock as i32);
        let p = meta.params();
        let phases: serde_json::Map<String, serde_json::Value> =
            PHASES.iter().zip(meta.build_ms).map(|(k, v)| (format!("{k} ms"), json!(v))).collect();
        JsonB(json!({
            "format_version": meta.version,
            "algorithm": "rnn_descent",
            "metric": meta.metric().name(),
            "dimensions": meta.dim,
            "degree": p.degree,
            "parameters": {"s": p.s, "r": p.r, "t1": p.t1, "t2": p.t2, "rho": p.rho},
            "build": {
                "device": match meta.build_device { 1 => "cpu", 2 => "gpu", _ => "none" },
                "gpu": (meta.build_device == 2).then(|| meta.device_name()),
                "threads": (meta.build_device == 1).then_some(meta.build_threads),
                "rows": meta.built_rows,
                "phases": phases,
            },
            "nodes": {"allocated": meta.node_count, "live": live, "deleted": deleted, "free": free},
            "out_degree": {
                "mean": if live > 0 { edges as f64 / live as f64 } else { 0.0 },
                "min": if live > 0 { min_deg } else { 0 },
                "max": max_deg,
            },
            "entry_point": meta.entry(),
            "generation": meta.generation,
            "pages": blocks,
            "search": search,
        }))
    }
}
