//! The planner's cost of a gpu_graph scan.
//!
//! As pgvector's HNSW estimate: PostgreSQL's generic estimate prices reading
//! the whole index (the total cost), while the cost before the first row is
//! the share a search actually visits, about ef_search × degree nodes. With a
//! LIMIT the planner interpolates between the two, so an ORDER BY … LIMIT k
//! query prefers the index once a table has some thousands of rows. Without
//! an ORDER BY on our operator the index is useless: infinite cost.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::gucs::EF_SEARCH;
use crate::storage::meta::Meta;

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
        if (*path).indexorderbys.is_null() {
            *startup = f64::INFINITY;
            *total = f64::INFINITY;
            *selectivity = 0.0;
            *correlation = 0.0;
            *pages = 0.0;
            return;
        }
        let mut costs = pg_sys::GenericCosts::default();
        pg_sys::genericcostestimate(root, path, loop_count, &mut costs);

        let info = (*path).indexinfo;
        let index = pg_sys::index_open((*info).indexoid, pg_sys::NoLock as i32);
        let degree = Meta::read(index).degree as f64;
        pg_sys::index_close(index, pg_sys::NoLock as i32);

        let tuples = (*info).tuples.max(1.0);
        let visited = EF_SEARCH.get() as f64 * degree;
        let ratio = (visited / tuples).min(1.0);
        costs.indexStartupCost = costs.indexTotalCost * ratio;

        *startup = costs.indexStartupCost;
        *total = costs.indexTotalCost;
        *selectivity = costs.indexSelectivity;
        *correlation = costs.indexCorrelation;
        *pages = costs.numIndexPages;
    }
}
