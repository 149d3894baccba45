//! --sim: the CPU model of the kernel against the CPU search, on a graph
//! built on the CPU (no GPU needed).

use std::time::Instant;

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::recall::mean_recall;
use gpu_graph_engine::rnn_descent;
use gpu_graph_gpu::search::sim::{simulate, SimStats};
use rayon::prelude::*;

use crate::common::{cpu_recall, Data, K};
use crate::Pol;

pub fn run(data: &Data, params: &BuildParams, efs: &[usize], pol: Pol, variants: &[String]) {
    let (base, queries) = (&data.base, &data.queries);
    let t = Instant::now();
    let g = rnn_descent::build(&base.data, base.dim, params, &mut |_: usize, _: usize| true).expect("build");
    println!("graph: rnn_descent on the CPU in {:.1} s", t.elapsed().as_secs_f64());
    let ix = FlatIndex::new(Metric::L2, base.dim, base.data.clone(), g);
    let mut pols = vec![("default".to_string(), pol)];
    pols.extend(variants.iter().map(|v| (v.clone(), pol.with(v))));
    for &ef in efs {
        let (cr, _) = cpu_recall(&ix, Metric::L2, queries, &data.truth, ef);
        println!("ef {ef:>4}: cpu recall@10 {cr:.4}");
        for (label, p) in &pols {
            let plan = p.policy.plan(K, ef, if p.ctas == 0 { 4 } else { p.ctas });
            let res: Vec<(Vec<f64>, SimStats)> = (0..queries.len())
                .into_par_iter()
                .map(|q| {
                    let (h, st) = simulate(&ix, queries.row(q), K, &plan);
                    (h.iter().map(|x| Metric::L2.to_sql(x.0)).collect(), st)
                })
                .collect();
            let found: Vec<Vec<f64>> = res.iter().map(|r| r.0.clone()).collect();
            let nq = queries.len() as f64;
            let mean = |f: &dyn Fn(&SimStats) -> u64| res.iter().map(|r| f(&r.1)).sum::<u64>() as f64 / nq;
            println!(
                "   {label:<28} plan {}x{:<4} recall@10 {:.4}  {:>6.0} dist/q  {:>5.0} exp/q  {:>5.1} steps/q  {:>5.1} merges/q  {:>5.0} scanned/q  capped {}",
                plan.ctas,
                plan.list,
                mean_recall(&found, &data.truth, K),
                mean(&|s| s.computed),
                mean(&|s| s.expanded),
                mean(&|s| s.steps),
                mean(&|s| s.merges),
                mean(&|s| s.scanned),
                res.iter().filter(|r| r.1.capped > 0).count()
            );
        }
    }
}
