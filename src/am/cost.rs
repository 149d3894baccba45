//! The planner's cost of a gpu_graph scan.
//!
//! As pgvector's HNSW estimate: the generic estimate over the index tuples a
//! search computes the distance of (about ef_search × degree / 2, at most
//! every row), all of it before the first row comes. Pricing the whole index
//! as the total (as this did before) made a 2,000-row table of 384 or 1536
//! dimensions take a Seq Scan + Sort that costs far more. Without
//! an ORDER BY on our operator the index is useless: infinite cost. So is
//! it for more than one distance key (`ORDER BY v <-> a, v <-> b`): the
//! search orders by one distance, and rows tied on it would come in no order
//! of the second; a Sort over another plan orders them right.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::gucs::EF_SEARCH;

#[pg_guard]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C-unwind" fn amcostestimate(
    root: *mut pg_sys::PlannerInfo,
    path: *mut pg_sys::IndexPath,
    loop_count: f64,
    startup: *mut pg_sys::Cost,
    total: *mut pg_sys::Cost,
    selectivity: *mut pg_sys::Selectivity,
    correlation: *mut f64,
    pages: *mut f64,
) {
    // SAFETY: the planner passes a valid path of this index and the
    // addresses of its five results. The planner locked the index when it
    // looked it up (get_relation_info), so opening it with NoLock is safe,
    // and it is a gpu_graph index (this is its access method's estimate).
    unsafe {
        let orderbys = (*path).indexorderbys;
        if orderbys.is_null() || (*orderbys).length > 1 {
            *startup = f64::INFINITY;
            *total = f64::INFINITY;
            *selectivity = 0.0;
            *correlation = 0.0;
            *pages = 0.0;
            return;
        }
        let info = (*path).indexinfo;
        let index = pg_sys::index_open((*info).indexoid, pg_sys::NoLock as i32);
        // (from the relation cache once a scan or plan read the meta page:
        // no lock on the page every insert locks)
        let degree = crate::worker::meta_mirror::degree(index) as f64;
        pg_sys::index_close(index, pg_sys::NoLock as i32);

        // the nodes whose distance a search computes: about ef_search × degree
        // / 2 (half a visited node's neighbours were seen already), at most
        // every row; their pages and per-tuple work are what the generic
        // estimate prices from numIndexTuples (as pgvector's HNSW estimate)
        let tuples = (*info).tuples.max(1.0);
        let mut costs = pg_sys::GenericCosts {
            numIndexTuples: (EF_SEARCH.get() as f64 * degree / 2.0).min(tuples),
            ..Default::default()
        };
        pg_sys::genericcostestimate(root, path, loop_count, &mut costs);
        // all of that work comes before the first row
        costs.indexStartupCost = costs.indexTotalCost;
        // a Seq Scan is priced by the heap's own pages, not the TOAST pages
        // its wide vectors are read from; pricing every index page a search
        // reads beyond the heap's count made the index lose at 2,000 rows of
        // 1536 dimensions, where it reads far less. As pgvector does, those
        // pages are not charged.
        let heap_pages = (*(*info).rel).pages as f64;
        if costs.numIndexPages > heap_pages {
            let extra = (costs.numIndexPages - heap_pages) * pg_sys::random_page_cost;
            costs.indexStartupCost = (costs.indexStartupCost - extra).max(0.0);
            costs.indexTotalCost = (costs.indexTotalCost - extra).max(costs.indexStartupCost);
        }

        *startup = costs.indexStartupCost;
        *total = costs.indexTotalCost;
        *selectivity = costs.indexSelectivity;
        *correlation = costs.indexCorrelation;
        *pages = costs.numIndexPages;
    }
}
