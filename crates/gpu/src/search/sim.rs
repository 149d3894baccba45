//! A CPU model of one query of kernels/search_persistent.cu: the same
//! lists, start, beam extend, shared visited set, stop rule and iteration
//! cap, with the slot's CTAs advanced in lock step (one step each in turn).
//! It runs without a GPU, so plans can be compared for recall (and work:
//! distances computed, steps) in CI or on a laptop; the device test then
//! measures time. It is a model, not the kernel: the real CTAs race, so
//! which CTA claims a node can differ.

use std::collections::HashSet;

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::node;
use gpu_graph_engine::NO_NODE;

use super::merge::merge_lists;
use super::plan::QueryPlan;
use crate::abi::{CAND_CAP, MAX_SCAN, MAX_SEEDS};

/// Work of one simulated query.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimStats {
    /// distances computed, all CTAs
    pub computed: u64,
    /// nodes expanded, all CTAs
    pub expanded: u64,
    /// lock steps until the last CTA stopped (a proxy for latency)
    pub steps: u64,
    /// sorts + merges (chunks of 32) over all CTAs
    pub merges: u64,
    /// CTAs stopped by the iteration cap
    pub capped: u32,
    /// distances of the scan before the start, all CTAs
    pub scanned: u64,
}

struct Cta {
    list: Vec<(f32, u32, bool)>,
    expanded: u32,
    done: bool,
}

/// The kernel's distance: squared L2, or -dot over all but the last
/// coordinate (inner product), summed in the plain order.
fn dist(ix: &FlatIndex, q: &[f32], node: u32) -> f32 {
    let x = ix.vector(node);
    if ix.metric == Metric::InnerProduct {
        let d = ix.stored_dim - 1;
        -x[..d].iter().zip(&q[..d]).map(|(a, b)| a * b).sum::<f32>()
    } else {
        x.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum()
    }
}

fn neighbors(ix: &FlatIndex, node: u32) -> &[u32] {
    let d = ix.graph.degree;
    &ix.graph.adjacency[node as usize * d..(node as usize + 1) * d]
}

fn absorb(ix: &FlatIndex, q: &[f32], cta: &mut Cta, cap: usize, new: &[(u32, bool)], st: &mut SimStats) {
    if new.is_empty() {
        return;
    }
    st.computed += new.len() as u64;
    let thr = if cta.list.len() >= cap { cta.list[cap - 1].0 } else { f32::INFINITY };
    let mut surv: Vec<(f32, u32, bool)> =
        new.iter().map(|&(n, e)| (dist(ix, q, n), n, e)).filter(|c| c.0 < thr).collect();
    for chunk in surv.chunks_mut(32) {
        st.merges += 1;
        chunk.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut merged = Vec::with_capacity(cta.list.len() + chunk.len());
        let (mut i, mut j) = (0, 0);
        while merged.len() < cap && (i < cta.list.len() || j < chunk.len()) {
            let take_old = j >= chunk.len()
                || (i < cta.list.len() && {
                    let (a, b) = (cta.list[i], chunk[j]);
                    a.0 < b.0 || (a.0 == b.0 && a.1 <= b.1)
                });
            if take_old {
                merged.push(cta.list[i]);
                i += 1;
            } else {
                merged.push(chunk[j]);
                j += 1;
            }
        }
        cta.list = merged;
    }
}

/// Node j of a sample of `total` spread evenly over the ids (the kernel's
/// spread_node): the seeds' and the scan's.
fn spread_node(j: usize, n: usize, total: usize) -> u32 {
    (j as u64 * n as u64 / total as u64) as u32
}

/// Claims unvisited nodes (shared set), in order.
fn claim(ix: &FlatIndex, visited: &mut HashSet<u32>, ids: impl Iterator<Item = (u32, bool)>) -> Vec<(u32, bool)> {
    let n = ix.len() as u32;
    ids.filter(|&(id, _)| id < n && visited.insert(id)).collect()
}

/// One query: the per-CTA lists (first k live entries each, as the kernel
/// writes them), the host's merge, and the work done.
pub fn simulate(ix: &FlatIndex, query: &[f32], k: usize, plan: &QueryPlan) -> (Vec<(f32, u32)>, SimStats) {
    let mut st = SimStats::default();
    let n = ix.len();
    let Some(entry) = ix.graph.entry.filter(|_| n > 0) else {
        return (Vec::new(), st);
    };
    let t_n = plan.ctas.max(1) as usize;
    let cap = plan.list.max(1) as usize;
    let deg = ix.graph.degree;
    let bmax = (CAND_CAP as usize / deg).clamp(1, 32);
    let bw = (plan.beam_width as usize).clamp(1, bmax);
    let seeds = plan.seeds.min(MAX_SEEDS) as usize;
    let mut visited: HashSet<u32> = HashSet::new();
    let mut ctas: Vec<Cta> = (0..t_n).map(|_| Cta { list: Vec::new(), expanded: 0, done: false }).collect();
    let scan = (plan.scan.min(MAX_SCAN) as usize).min(n);
    if scan > 0 {
        // start: each CTA's list the nearest of its share of the scan,
        // claimed (their distances already known)
        for (t, cta) in ctas.iter_mut().enumerate() {
            let mut mine: Vec<(f32, u32)> =
                (t..scan).step_by(t_n).map(|j| spread_node(j, n, scan)).map(|v| (dist(ix, query, v), v)).collect();
            st.scanned += mine.len() as u64;
            mine.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            mine.truncate(cap);
            for (d, v) in mine {
                visited.insert(v);
                cta.list.push((d, v, false));
            }
        }
    } else {
        // start: entry + this CTA's seeds (seed j is node j * n / seeds)
        for (t, cta) in ctas.iter_mut().enumerate() {
            let mine = (t..seeds).step_by(t_n).map(|j| (spread_node(j, n, seeds), false));
            let ids = std::iter::once((entry, true)).chain(mine);
            let new = claim(ix, &mut visited, ids);
            absorb(ix, query, cta, cap, &new, &mut st);
        }
        // the entry's neighbours, split j % T == t
        let row = neighbors(ix, entry);
        for (t, cta) in ctas.iter_mut().enumerate() {
            let ids = row.iter().enumerate().filter(|(j, _)| j % t_n == t).map(|(_, &v)| (v, false));
            let new = claim(ix, &mut visited, ids.filter(|&(v, _)| v != NO_NODE));
            absorb(ix, query, cta, cap, &new, &mut st);
            cta.expanded = 1;
        }
    }
    st.steps = 1;
    loop {
        let mut active = false;
        for cta in ctas.iter_mut() {
            if cta.done {
                continue;
            }
            if cta.expanded >= plan.max_expand {
                cta.done = true;
                st.capped += 1;
                continue;
            }
            let first = cta.list.iter().position(|c| !c.2);
            let Some(first) = first else {
                cta.done = true;
                continue;
            };
            let want = if first as u32 >= plan.offset_beam { bw } else { 1 };
            let mut sel = Vec::with_capacity(want);
            for c in cta.list.iter_mut().skip(first) {
                if sel.len() == want {
                    break;
                }
                if !c.2 {
                    c.2 = true;
                    sel.push(c.1);
                }
            }
            active = true;
            let ids: Vec<(u32, bool)> =
                sel.iter().flat_map(|&s| neighbors(ix, s).iter().map(|&v| (v, false))).collect();
            let new = claim(ix, &mut visited, ids.into_iter());
            absorb(ix, query, cta, cap, &new, &mut st);
            cta.expanded += sel.len() as u32;
        }
        if !active {
            break;
        }
        st.steps += 1;
    }
    let deleted = |v: u32| !node::is_result(ix.flags[v as usize]);
    let outs: Vec<Vec<(f32, u32)>> =
        ctas.iter().map(|c| c.list.iter().filter(|e| !deleted(e.1)).take(k).map(|e| (e.0, e.1)).collect()).collect();
    st.expanded = ctas.iter().map(|c| c.expanded as u64).sum();
    let refs: Vec<&[(f32, u32)]> = outs.iter().map(|v| v.as_slice()).collect();
    (merge_lists(&refs, k, |v| !deleted(v)), st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::plan::SearchPolicy;
    use gpu_graph_engine::params::BuildParams;
    use gpu_graph_engine::random::mix64;
    use gpu_graph_engine::recall::{exact_knn, mean_recall};
    use gpu_graph_engine::rnn_descent;
    use gpu_graph_engine::search::search;

    fn data(n: usize, dim: usize, seed: u64) -> Vec<f32> {
        (0..n * dim).map(|i| ((mix64(seed + i as u64) >> 40) as f32 / (1u64 << 24) as f32) * 10.0).collect()
    }

    /// With one CTA and no seeds or scan the model is the CPU beam search
    /// (same results); with several and the default start, recall stays at
    /// least as high at equal ef.
    #[test]
    fn model_matches_cpu_search() {
        let (n, dim, k) = (3000, 16, 10);
        let base = data(n, dim, 1);
        let queries = data(50, dim, 99);
        let params = BuildParams { degree: 16, ..BuildParams::default() };
        let g = rnn_descent::build(&base, dim, &params, &mut |_: usize, _: usize| true).unwrap();
        let ix = FlatIndex::new(Metric::L2, dim, base.clone(), g);
        let truth = exact_knn(&base, dim, &queries, k, Metric::L2);
        for ef in [10usize, 20, 40] {
            let pol = SearchPolicy { beam_width: 1, seeds: 0, scan: 0, ..SearchPolicy::default() };
            let one = pol.plan_with(1, ef);
            let mut cpu_found = Vec::new();
            let mut sim_found = Vec::new();
            let mut multi_found = Vec::new();
            for qi in 0..50 {
                let q = &queries[qi * dim..(qi + 1) * dim];
                let cpu: Vec<(f32, u32)> = search(&ix, Metric::L2, q, k, ef).iter().map(|h| (h.dist, h.node)).collect();
                let (sim, _) = simulate(&ix, q, k, &one);
                // same nodes; distances up to the summation order
                let ids = |v: &[(f32, u32)]| v.iter().map(|x| x.1).collect::<Vec<_>>();
                assert_eq!(ids(&cpu), ids(&sim), "ef {ef} query {qi}");
                for (a, b) in cpu.iter().zip(&sim) {
                    assert!((a.0 - b.0).abs() <= 1e-4 * a.0.abs().max(1.0), "{a:?} {b:?}");
                }
                cpu_found.push(cpu.iter().map(|h| (h.0 as f64).sqrt()).collect::<Vec<_>>());
                sim_found.push(sim.iter().map(|h| (h.0 as f64).sqrt()).collect::<Vec<_>>());
                let (m, _) = simulate(&ix, q, k, &SearchPolicy::default().plan(k, ef, 4));
                multi_found.push(m.iter().map(|h| (h.0 as f64).sqrt()).collect::<Vec<_>>());
            }
            let rc = mean_recall(&cpu_found, &truth, k);
            let rm = mean_recall(&multi_found, &truth, k);
            assert!(rm >= rc - 0.02, "ef {ef}: multi-CTA recall {rm} vs CPU {rc}");
        }
    }

    #[test]
    fn deleted_never_returned() {
        let (n, dim, k) = (1000, 8, 10);
        let base = data(n, dim, 5);
        let params = BuildParams { degree: 12, ..BuildParams::default() };
        let g = rnn_descent::build(&base, dim, &params, &mut |_: usize, _: usize| true).unwrap();
        let mut ix = FlatIndex::new(Metric::L2, dim, base.clone(), g);
        for f in ix.flags.iter_mut().step_by(3) {
            *f = node::DELETED;
        }
        for qi in 0..20 {
            let q = &base[qi * dim..(qi + 1) * dim];
            let (r, _) = simulate(&ix, q, k, &SearchPolicy::default().plan(k, 40, 4));
            assert_eq!(r.len(), k);
            assert!(r.iter().all(|&(_, v)| v % 3 != 0));
            assert!(r.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 != w[1].1));
        }
    }
}
