//! Throughput: `threads` submitters, each submit -> wait in a loop for
//! `secs` (and at least until every query was answered once); queries/s,
//! p50/p99 latency (submit to answer) and recall@10, and the latency's
//! breakdown: the kernel's own time (its clock: the first CTA taking the
//! query to the last one's hits written), its start and steps, and the
//! rest (the request's copy and slot word, the wake-up, the fences and the
//! finish word, the host seeing it).

use std::process::exit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::recall::mean_recall;
use gpu_graph_gpu::search::{QueryPlan, ResidentId, SearchError, SearchServer};
use parking_lot::Mutex;

use crate::common::{Data, Verdict, K};
use crate::{Indexes, Pol, WAIT};

/// What one run measured.
struct Run {
    qps: f64,
    p50_us: f64,
    p99_us: f64,
    recall: f64,
    errors: usize,
    first_error: Option<String>,
    answered: usize,
    computed: f64,
    expanded: f64,
    capped: usize,
    /// p50 of the kernel's span, of its start, of the rest (µs); mean steps
    kernel_us: f64,
    start_us: f64,
    rest_us: f64,
    steps: f64,
    /// the slowest CTA's mean cycles, claim, dist, merge
    cycles: [f64; 4],
    /// p50 of the rest's parts (µs): see [`Parts`]
    parts: [f64; 5],
}

/// The rest of one answer's latency (outside the kernel's span), ns: the
/// dispatcher's entry seen -> the first CTA taking it, of which the
/// request's copy; the last fence and finish word of a CTA; and by the
/// host's clock (CLOCK_REALTIME) against %globaltimer, which run apart by
/// whatever offset the two have: submit -> the dispatcher seeing the entry,
/// the hits written -> the host holding the answer.
type Parts = [i64; 5];

/// What every submitter adds up.
#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    /// per answer: the kernel's span, its start (ns) and steps
    gpu: Vec<(u64, u64, u64)>,
    /// summed over answers: the slowest CTA's cycles, claim, dist, merge
    cycles: [u64; 4],
    /// per answer: latency less the kernel's span (ns)
    rest_ns: Vec<u64>,
    parts: Vec<Parts>,
    first: Vec<(usize, Vec<f64>)>,
    computed: u64,
    expanded: u64,
    capped: usize,
    errors: usize,
    first_error: Option<String>,
}

/// Of ns values (the host clock's parts may be negative), in us.
fn percentile_us<T: Ord + Copy + Into<i128>>(v: &mut [T], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize].into() as f64 / 1e3
}

pub struct Runs<'a> {
    pub server: &'a SearchServer,
    pub id: ResidentId,
    pub ix: &'a Indexes,
    pub data: &'a Data,
    pub efs: &'a [usize],
    pub cpu: &'a [f64],
    pub secs: f64,
}

impl Runs<'_> {
    /// One submitter's loop; its tally.
    fn submitter(&self, plan: &QueryPlan, next: &AtomicUsize, stop: &AtomicBool, t0: Instant) -> Tally {
        let nq = self.ix.l2_queries.len();
        let mut t = Tally::default();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= nq && stop.load(Ordering::Relaxed) {
                break;
            }
            let start = Instant::now();
            let posted = realtime_ns();
            let r = self.server.submit_plan(self.id, &self.ix.l2_queries[i % nq], K, plan);
            match r.and_then(|mut tk| self.server.wait(&mut tk, WAIT)) {
                Ok(a) => {
                    let ns = start.elapsed().as_nanos() as u64;
                    let held = realtime_ns();
                    t.latencies_ns.push(ns);
                    let g = a.times;
                    let seen = g.picked_at as i64 - g.dispatch_ns as i64;
                    t.parts.push([
                        g.dispatch_ns as i64,
                        g.copy_ns as i64,
                        g.fence_ns as i64,
                        seen - posted,
                        held - g.searched_at as i64,
                    ]);
                    t.gpu.push((g.span_ns as u64, g.start_ns as u64, g.steps as u64));
                    for (a, b) in t.cycles.iter_mut().zip([g.cycles, g.claim_cycles, g.dist_cycles, g.merge_cycles]) {
                        *a += b as u64;
                    }
                    t.rest_ns.push(ns.saturating_sub(g.span_ns as u64));
                    (t.computed, t.expanded) = (t.computed + a.computed as u64, t.expanded + a.expanded as u64);
                    t.capped += (a.capped > 0) as usize;
                    if i < nq {
                        t.first.push((i, a.hits.iter().map(|h| Metric::L2.to_sql(h.0)).collect()));
                    }
                }
                Err(e) => {
                    t.errors += 1;
                    t.first_error.get_or_insert_with(|| e.to_string());
                    if matches!(e, SearchError::Poisoned(_) | SearchError::Closed) {
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                }
            }
            if t0.elapsed().as_secs_f64() >= self.secs {
                stop.store(true, Ordering::Relaxed);
            }
        }
        t
    }

    fn run(&self, plan: &QueryPlan, threads: usize) -> Run {
        let nq = self.ix.l2_queries.len();
        let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        let all = Mutex::new(Tally::default());
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let t = self.submitter(plan, &next, &stop, t0);
                    let mut a = all.lock();
                    a.latencies_ns.extend(t.latencies_ns);
                    a.gpu.extend(t.gpu);
                    for (x, y) in a.cycles.iter_mut().zip(t.cycles) {
                        *x += y;
                    }
                    a.rest_ns.extend(t.rest_ns);
                    a.parts.extend(t.parts);
                    a.first.extend(t.first);
                    (a.computed, a.expanded, a.capped, a.errors) =
                        (a.computed + t.computed, a.expanded + t.expanded, a.capped + t.capped, a.errors + t.errors);
                    if a.first_error.is_none() {
                        a.first_error = t.first_error;
                    }
                });
            }
        });
        let el = t0.elapsed().as_secs_f64();
        let mut a = all.into_inner();
        let mut found = vec![Vec::new(); nq];
        for (qi, d) in a.first.drain(..) {
            found[qi] = d;
        }
        let answered = a.latencies_ns.len();
        let mut span: Vec<u64> = a.gpu.iter().map(|g| g.0).collect();
        let mut start: Vec<u64> = a.gpu.iter().map(|g| g.1).collect();
        let steps = a.gpu.iter().map(|g| g.2).sum::<u64>() as f64 / answered.max(1) as f64;
        let parts = std::array::from_fn(|i| percentile_us(&mut a.parts.iter().map(|p| p[i]).collect::<Vec<_>>(), 0.5));
        Run {
            parts,
            kernel_us: percentile_us(&mut span, 0.5),
            start_us: percentile_us(&mut start, 0.5),
            rest_us: percentile_us(&mut a.rest_ns, 0.5),
            steps,
            cycles: a.cycles.map(|c| c as f64 / answered.max(1) as f64),
            qps: answered as f64 / el,
            p50_us: percentile_us(&mut a.latencies_ns, 0.5),
            p99_us: percentile_us(&mut a.latencies_ns, 0.99),
            recall: mean_recall(&found, &self.data.truth, K),
            errors: a.errors,
            first_error: a.first_error,
            answered,
            computed: a.computed as f64 / answered.max(1) as f64,
            expanded: a.expanded as f64 / answered.max(1) as f64,
            capped: a.capped,
        }
    }

    /// The default policy at every thread count and ef, then each variant
    /// at `variant_threads`; only the default's recall gaps fail.
    pub fn all(
        &self,
        pol: Pol,
        threads: &[usize],
        variants: &[String],
        variant_threads: &[usize],
        verdict: &mut Verdict,
    ) {
        println!("throughput ({} s per run, k {K}; latency = submit to answer):", self.secs);
        let mut pols = vec![("default".to_string(), pol)];
        pols.extend(variants.iter().map(|v| (v.clone(), pol.with(v))));
        let slot_ctas = self.server.info().ctas_per_slot;
        for (label, p) in &pols {
            let ctas = if p.ctas == 0 { slot_ctas } else { p.ctas.min(slot_ctas) };
            let ths = if label == "default" { threads } else { variant_threads };
            for &th in ths {
                for (ei, &ef) in self.efs.iter().enumerate() {
                    let plan = p.policy.plan(K, ef, ctas);
                    let r = self.run(&plan, th);
                    let ok = r.errors == 0 && r.recall >= self.cpu[ei] - 0.01;
                    let line = format!(
                        "{label:<10} threads {th:>3} ef {ef:>4} plan {}x{:<3}: {:>8.0} queries/s  p50 {:>7.1} us  p99 {:>7.1} us  recall@10 {:.4} (cpu {:.4})  {:.0} dist/q {:.0} exp/q, capped {}{}",
                        plan.ctas,
                        plan.list,
                        r.qps,
                        r.p50_us,
                        r.p99_us,
                        r.recall,
                        self.cpu[ei],
                        r.computed,
                        r.expanded,
                        r.capped,
                        if r.errors > 0 {
                            format!("; {} errors of {}, first: {}", r.errors, r.answered + r.errors, r.first_error.unwrap_or_default())
                        } else {
                            String::new()
                        }
                    );
                    let line = format!(
                        "{line}\n{:>14} p50: kernel {:.1} us (start {:.1} us, {:.1} steps), rest {:.1} us; mean cycles {:.0}: claim {:.0}%, distances {:.0}%, merges {:.0}%",
                        "",
                        r.kernel_us,
                        r.start_us,
                        r.steps,
                        r.rest_us,
                        r.cycles[0],
                        100.0 * r.cycles[1] / r.cycles[0].max(1.0),
                        100.0 * r.cycles[2] / r.cycles[0].max(1.0),
                        100.0 * r.cycles[3] / r.cycles[0].max(1.0)
                    );
                    let line = format!(
                        "{line}\n{:>14} rest p50: dispatch {:.1} us (copy {:.1}), fence and finish {:.1} us; host clock: submit -> entry seen {:.1} us, hits written -> answer held {:.1} us",
                        "", r.parts[0], r.parts[1], r.parts[2], r.parts[3], r.parts[4]
                    );
                    if label == "default" {
                        verdict.check(ok, line);
                    } else {
                        println!("{} {line}", if ok { "ok  " } else { "FAIL" });
                    }
                    if r.errors > 0 {
                        println!("RESULT: FAIL (errors during a throughput run)");
                        exit(1);
                    }
                }
            }
        }
    }
}

/// CLOCK_REALTIME in ns: what %globaltimer is compared with.
fn realtime_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}
