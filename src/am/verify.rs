//! gpu_graph_verify(index): the index checked page by page, as amcheck
//! checks a btree. One row per problem found; none for a healthy index.
//!
//! Checked: the meta page (as every read checks it); each list's ids in
//! range, without self loops, repeats, free or deleted neighbours (VACUUM
//! removes those from every list before it frees them); the free list's
//! chain against the slots flagged free; every live node reachable from the
//! entry point; each live node's heap TID naming a used line pointer of the
//! table. Problems are reported, not raised, so one damaged list does not
//! hide the rest.

use gpu_graph_engine::merge::reach_lists;
use gpu_graph_engine::store::GraphView;
use gpu_graph_engine::NO_NODE;
use pgrx::prelude::*;
use pgrx::{pg_sys, PgRelation};

use crate::storage::buffer::Locked;
use crate::storage::codec::payload_to_tid;
use crate::storage::layout::{FLAG_DELETED, FLAG_FREE};
use crate::storage::meta::Meta;
use crate::storage::page_store::PageStore;

/// At most this many problems are listed (a badly damaged index has one per node).
const MAX_PROBLEMS: usize = 1000;

struct Problems {
    rows: Vec<(i64, Option<i64>, String)>,
    count: usize,
}

impl Problems {
    fn add(&mut self, block: u32, node: Option<u32>, what: String) {
        self.count += 1;
        if self.rows.len() < MAX_PROBLEMS {
            self.rows.push((block as i64, node.map(|n| n as i64), what));
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Slot {
    Live(u64),
    Deleted,
    Free(u64),
}

#[pg_extern(sql = "
CREATE FUNCTION gpu_graph_verify(index regclass)
    RETURNS TABLE (block bigint, node bigint, problem text)
    AS 'MODULE_PATHNAME', 'gpu_graph_verify_wrapper' LANGUAGE C STRICT VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION gpu_graph_verify(regclass) FROM PUBLIC;
COMMENT ON FUNCTION gpu_graph_verify(regclass) IS
    'gpu_graph index check: one row per problem (lists, free list, reachability, heap TIDs); none when healthy';
")]
fn gpu_graph_verify(
    index: pg_sys::Oid,
) -> TableIterator<'static, (name!(block, i64), name!(node, Option<i64>), name!(problem, String))> {
    let lock = pg_sys::AccessShareLock as i32;
    // SAFETY: in a transaction, a gpu_graph index open and share-locked
    // until index_close; its table is opened with the same lock to read
    // line pointers.
    let problems = unsafe {
        let rel = super::relation::open_gpu_graph_index(index, lock, "gpu_graph_verify");
        let meta = Meta::read(rel);
        let heap = PgRelation::with_lock((*(*rel).rd_index).indrelid, lock);
        let problems = if meta.dim == 0 { Problems { rows: Vec::new(), count: 0 } } else { check(rel, &meta, &heap) };
        pg_sys::index_close(rel, lock);
        problems
    };
    let mut rows = problems.rows;
    if problems.count > MAX_PROBLEMS {
        rows.push((0, None, format!("… and {} more problems", problems.count - MAX_PROBLEMS)));
    }
    TableIterator::new(rows)
}

/// # Safety
/// `rel` must be an open gpu_graph index whose meta page is `meta`, `heap`
/// its table, open.
unsafe fn check(rel: pg_sys::Relation, meta: &Meta, heap: &PgRelation) -> Problems {
    let mut p = Problems { rows: Vec::new(), count: 0 };
    // SAFETY: the caller's contract.
    let store = unsafe { PageStore::new(rel, meta) };
    let layout = store.layout;
    let n = meta.node_count;
    let mut slots = Vec::with_capacity(n as usize);
    store.for_each_header(0..n, &mut |_, h| {
        slots.push(if h.flags & FLAG_FREE != 0 {
            Slot::Free(h.payload())
        } else if h.flags & FLAG_DELETED != 0 {
            Slot::Deleted
        } else {
            Slot::Live(h.payload())
        })
    });

    // lists, read raw page by page (the store's list reader raises an
    // ERROR at an id out of range; here it is a problem to report)
    let degree = layout.degree;
    let adjacency = store.adjacency();
    for node in 0..n {
        if node % 1024 == 0 {
            crate::latch::check_interrupts();
        }
        let block = layout.graph_block(node);
        let list: Vec<u32> = adjacency[node as usize * degree..(node as usize + 1) * degree]
            .iter()
            .copied()
            .take_while(|&u| u != NO_NODE)
            .collect();
        let mut seen = std::collections::HashSet::new();
        for &u in &list {
            if u >= n {
                p.add(block, Some(node), format!("its list names node {u}, beyond the index's {n}"));
            } else if u == node {
                p.add(block, Some(node), "its list names itself".into());
            } else if !seen.insert(u) {
                p.add(block, Some(node), format!("its list names node {u} twice"));
            } else if matches!(slots[u as usize], Slot::Free(_)) {
                p.add(block, Some(node), format!("its list names node {u}, a free slot"));
            } else if slots[u as usize] == Slot::Deleted {
                p.add(block, Some(node), format!("its list names node {u}, deleted (an interrupted VACUUM?)"));
            }
        }
        if matches!(slots[node as usize], Slot::Free(_)) && !list.is_empty() {
            p.add(block, Some(node), "a free slot with a list".into());
        }
    }

    // the free list
    let mut on_chain = vec![false; n as usize];
    let (mut at, mut steps) = (meta.free_head, 0u32);
    while at != NO_NODE {
        if at >= n {
            p.add(0, None, format!("the free list names node {at}, beyond the index's {n}"));
            break;
        }
        if on_chain[at as usize] {
            p.add(layout.vector_block(at), Some(at), "the free list loops here".into());
            break;
        }
        on_chain[at as usize] = true;
        steps += 1;
        match slots[at as usize] {
            Slot::Free(next) => at = next as u32,
            _ => {
                p.add(layout.vector_block(at), Some(at), "on the free list but not a free slot".into());
                break;
            }
        }
    }
    if steps != meta.free_count {
        p.add(0, None, format!("the meta page counts {} free slots, its chain holds {steps}", meta.free_count));
    }
    for (node, s) in slots.iter().enumerate() {
        if matches!(s, Slot::Free(_)) && !on_chain[node] {
            p.add(layout.vector_block(node as u32), Some(node as u32), "a free slot not on the free list".into());
        }
    }

    // reachability of live nodes from the entry point (and the pinned
    // outliers, which every search starts from too)
    let live = |u: u32| matches!(slots[u as usize], Slot::Live(_));
    let mut starts = Vec::new();
    for (u, what) in
        meta.entry().map(|e| (e, "the entry point")).into_iter().chain(meta.pinned().map(|u| (u, "a pinned outlier")))
    {
        if live(u) {
            starts.push(u);
        } else {
            p.add(0, Some(u), format!("{what} is not a live node"));
        }
    }
    let reached = reach_lists(&adjacency, degree, &starts);
    let unreachable: Vec<u32> = (0..n).filter(|&u| live(u) && !reached[u as usize]).collect();
    for &u in unreachable.iter().take(20) {
        p.add(layout.graph_block(u), Some(u), "a live node no search from the entry point reaches".into());
    }
    if unreachable.len() > 20 {
        p.add(0, None, format!("{} live nodes in all are unreachable", unreachable.len()));
    }

    // heap TIDs
    // SAFETY: `heap` is open.
    let heap_blocks =
        unsafe { pg_sys::RelationGetNumberOfBlocksInFork(heap.as_ptr(), pg_sys::ForkNumber::MAIN_FORKNUM) };
    for node in 0..n {
        let Slot::Live(payload) = slots[node as usize] else { continue };
        if node % 1024 == 0 {
            crate::latch::check_interrupts();
        }
        let tid = payload_to_tid(payload);
        let block = ((tid.ip_blkid.bi_hi as u32) << 16) | tid.ip_blkid.bi_lo as u32;
        let what = if block >= heap_blocks {
            Some(format!("its heap TID ({block},{}) lies beyond the table's {heap_blocks} blocks", tid.ip_posid))
        } else {
            // SAFETY: `heap` is open and `block` within it; the page is read
            // under a share lock and released.
            unsafe { line_pointer_problem(heap.as_ptr(), block, tid.ip_posid) }
        };
        if let Some(w) = what {
            p.add(layout.vector_block(node), Some(node), w);
        }
    }
    p
}

/// What is wrong with heap TID (`block`, `offset`) for a live index entry:
/// an offset past the page's line pointers, or an unused one (VACUUM frees a
/// line pointer only after every index let go of it).
///
/// # Safety
/// `heap` must be open and `block` one of its blocks.
unsafe fn line_pointer_problem(heap: pg_sys::Relation, block: u32, offset: u16) -> Option<String> {
    // SAFETY: the caller's contract; the buffer stays pinned and
    // share-locked (`Locked`, any relation's main fork) while its header and
    // line pointer are read.
    unsafe {
        let b = Locked::read(heap, block, false);
        let page = pg_sys::BufferGetPage(b.buf) as *const pg_sys::PageHeaderData;
        let lower = (*page).pd_lower as usize;
        let max = (lower.saturating_sub(std::mem::size_of::<pg_sys::PageHeaderData>()))
            / std::mem::size_of::<pg_sys::ItemIdData>();
        if offset == 0 || offset as usize > max {
            Some(format!("its heap TID ({block},{offset}) is past the page's {max} line pointers"))
        } else {
            let item = (*page).pd_linp.as_ptr().add(offset as usize - 1);
            ((*item).lp_flags() == pg_sys::LP_UNUSED).then(|| format!("its heap TID ({block},{offset}) is unused"))
        }
    }
}
