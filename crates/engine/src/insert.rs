//! Linking a new node into a built graph (INSERT/COPY after CREATE INDEX).
//!
//! Concurrency: a list is never rewritten from a stale read. Each change is
//! computed outside the store's lock from a snapshot of the list, then
//! written by `update_neighbors` only if the list still equals the snapshot,
//! else recomputed. No lock is held while other nodes are read, so a store
//! with page locks (PostgreSQL) cannot deadlock here; a failed write means
//! another writer made progress, so the retry loop cannot starve everyone.

use crate::candidates::Candidates;
use crate::metric::Metric;
use crate::search::Search;
use crate::store::GraphMut;

/// Stores `stored` with `payload`, searches its neighbours with beam
/// `ef_construction` (graph distance), keeps them by the graph's filter ([`GraphView::filter`]),
/// writes its list, then adds the reverse edge to each kept neighbour: appended
/// when that list has room, else the list plus the new node is filtered again and
/// cut to `degree`. The first node of an empty graph becomes the entry point.
/// Returns the new node's id.
///
/// The node is stored first (unreachable until linked), and inserts racing
/// into an empty graph agree on one entry through [`GraphMut::set_entry_if`]:
/// the one that set it is done, every other one links itself from it.
pub fn insert<G: GraphMut>(store: &G, stored: &[f32], payload: u64, ef_construction: usize) -> u32 {
    insert_near(store, stored, payload, ef_construction, None)
}

/// [`insert`] with the neighbour search's answer given: `found`, the nodes
/// nearest `stored` by graph distance as another search found them (the
/// search worker's, on the GPU: the search is most of an insert's CPU).
/// They are read again from the store like the search's own hits; when
/// none of them is a live node, the search runs here after all.
pub fn insert_near<G: GraphMut>(
    store: &G,
    stored: &[f32],
    payload: u64,
    ef_construction: usize,
    found: Option<Vec<u32>>,
) -> u32 {
    let degree = store.degree();
    let id = store.allocate(stored, payload);
    let mut found = found;
    let kept = loop {
        let entry = store.entry();
        if entry.is_none() {
            if store.set_entry_if(None, Some(id)).is_none() {
                return id;
            }
            continue; // another insert became the entry: link to it
        }
        let given = found.take();
        let searched = given.is_none();
        let nodes = given.unwrap_or_else(|| {
            // L2 over stored vectors is the graph distance, whatever the SQL metric
            let mut search = Search::new(store, Metric::L2, stored);
            search.next_round(store, ef_construction.max(degree)).iter().map(|h| h.node).collect()
        });
        let kept = Candidates::collect(store, stored, nodes.into_iter().filter(|&n| n != id)).keep(
            store.filter(),
            store.order(),
            usize::MAX,
            degree,
        );
        if !kept.is_empty() {
            break kept;
        }
        if !searched {
            continue; // nothing live among them: search here
        }
        // no other live node is left: start afresh from this one, unless a
        // concurrent insert changed the entry meanwhile (then search again)
        if store.set_entry_if(entry, Some(id)) == entry {
            return id;
        }
    };
    store.update_neighbors(id, &mut |list| {
        // keep what a concurrent insert may have linked here already
        let extra: Vec<u32> = list.drain(..).filter(|u| !kept.iter().any(|k| k.0 == *u)).collect();
        list.extend(kept.iter().map(|k| k.0));
        list.extend(extra);
        list.truncate(degree);
        true
    });
    for &(n, _) in &kept {
        link_back(store, n, id);
    }
    id
}

/// Adds `id` to `n`'s list: appended if there is room, else `n`'s list
/// plus `id` is re-pruned (which may leave `id` out). In a graph with an
/// order (TSDG's), a list with room takes `id` in that order instead.
fn link_back<G: GraphMut>(store: &G, n: u32, id: u32) {
    let degree = store.degree();
    let order = store.order();
    let mut current = Vec::new();
    loop {
        let mut recompute = false;
        store.update_neighbors(n, &mut |list| {
            if list.contains(&id) {
                return false;
            }
            if list.len() < degree && order.is_none() {
                list.push(id);
                return true;
            }
            recompute = true;
            false
        });
        if !recompute {
            return;
        }
        store.neighbors(n, &mut current);
        let mut own = Vec::new();
        let Some(v) = store.visit(n, |x| {
            own.extend_from_slice(x);
            0.0
        }) else {
            return; // freed meanwhile
        };
        if v.deleted || current.contains(&id) {
            return;
        }
        let room = current.len() < degree;
        let cands = Candidates::collect(store, &own, current.iter().copied().chain([id]));
        let kept = match order {
            Some(order) if room => cands.ordered(order, degree),
            _ => cands.keep(store.filter(), order, usize::MAX, degree),
        };
        let pruned: Vec<u32> = kept.iter().map(|k| k.0).collect();
        if store.replace_neighbors_if(n, &current, &pruned) {
            return;
        }
    }
}
