//! The batch kernel (SearchServer::submit_batch): every answer checked and
//! recall against the CPU's at the same ef (one CTA a query is the CPU's
//! search), both indexes; queries/s by batch size against the persistent
//! kernel's; single queries' latency while a large batch runs.

use std::time::{Duration, Instant};

use gpu_graph_engine::metric::Metric;
use gpu_graph_gpu::error::GpuError;
use gpu_graph_gpu::search::{BatchAnswers, ResidentId, SearchError, SearchServer};

use crate::common::{cpu_recall, Data, Verdict, K};
use crate::{score, Indexes, WAIT};

/// Submits one batch and waits for it; its answers and seconds.
fn run_batch(
    server: &SearchServer,
    id: ResidentId,
    queries: &[f32],
    ef: usize,
    width: usize,
) -> Result<(BatchAnswers, f64), String> {
    let t = Instant::now();
    let ticket = server.submit_batch(id, queries, K, ef, width).map_err(|e| e.to_string())?;
    loop {
        if let Some(a) = server.poll_batch(&ticket).map_err(|e| e.to_string())? {
            return Ok((a, t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > WAIT * 12 {
            return Err("no answer in 60 s".into());
        }
        std::thread::yield_now();
    }
}

/// The answers checked one by one; recall@10 (operator distances) and the
/// first bad answer.
fn check(
    answers: &BatchAnswers,
    ix: &gpu_graph_engine::flat::FlatIndex,
    queries: &[Vec<f32>],
    truth: &[Vec<(u32, f64)>],
) -> (f64, Option<String>) {
    score(answers.iter().map(|a| Ok(a.as_slice())), ix, queries, truth)
}

pub fn run(
    server: &SearchServer,
    (id, ip_id): (ResidentId, ResidentId),
    ix: &Indexes,
    data: &Data,
    efs: &[usize],
    cpu: &[f64],
    v: &mut Verdict,
) {
    let si = server.info();
    println!("batch: {} blocks ({} resident per SM alone), one CTA a query", si.batch_blocks, si.batch_blocks_per_sm);
    if let Some(why) = server.batch_refused_for(id) {
        // refused by design (SearchServer::submit_batch): checked to be refused
        v.check(
            matches!(
                server.submit_batch(id, &ix.l2_queries[0], K, efs[0], 0),
                Err(SearchError::Gpu(GpuError::Unsupported(_)))
            ),
            format!("batch refused: {why}"),
        );
        return;
    }
    let flat: Vec<f32> = ix.l2_queries.concat();
    let nq = ix.l2_queries.len();
    for (ei, &ef) in efs.iter().enumerate() {
        let plan = server.batch_plan(K, ef);
        if plan.list as usize > si.list_cap {
            continue;
        }
        match run_batch(server, id, &flat, ef, 0) {
            Ok((a, secs)) => {
                let (r, bad) = check(&a, &ix.l2, &ix.l2_queries, &data.truth);
                v.check(
                    bad.is_none() && a.len() == nq && r >= cpu[ei] - 0.01,
                    format!(
                        "batch ef {ef:>4}: recall@10 {r:.4} (cpu {:.4}), {nq} queries in {:.1} ms = {:.0} queries/s{}",
                        cpu[ei],
                        secs * 1e3,
                        nq as f64 / secs,
                        bad.map(|b| format!("; {b}")).unwrap_or_default()
                    ),
                );
            }
            Err(e) => {
                v.check(false, format!("batch ef {ef}: {e}"));
            }
        }
    }
    // the inner-product index
    let ef = *efs.iter().max().unwrap_or(&64);
    let ip_flat: Vec<f32> = ix.ip_queries.concat();
    let (cr, _) = cpu_recall(&ix.ip, Metric::InnerProduct, &data.queries, &ix.ip_truth, ef);
    match run_batch(server, ip_id, &ip_flat, ef, 0) {
        Ok((a, _)) => {
            let (r, bad) = check(&a, &ix.ip, &ix.ip_queries, &ix.ip_truth);
            v.check(
                bad.is_none() && r >= cr - 0.01,
                format!(
                    "batch, inner product index: recall@10 {r:.4} at ef {ef} (cpu {cr:.4}){}",
                    bad.map(|b| format!("; {b}")).unwrap_or_default()
                ),
            );
        }
        Err(e) => {
            v.check(false, format!("batch, inner product index: {e}"));
        }
    }
    prefixes(server, id, ix, data, &flat, efs);
    sizes(server, id, &flat, ix.l2_queries[0].len(), efs);
    beside(server, id, ix, &flat, efs, v);
}

/// Recall and queries/s (16,384 queries a call) through the first entries
/// of each list (TSDG's prefix; on this graph the lists are in prune
/// order); every answer checked.
fn prefixes(server: &SearchServer, id: ResidentId, ix: &Indexes, data: &Data, flat: &[f32], efs: &[usize]) {
    let dim = ix.l2_queries[0].len();
    let big: Vec<f32> = flat.iter().copied().cycle().take(16384 * dim).collect();
    for width in [0usize, 24, 16] {
        let mut line = format!("batch through the first {width} entries of each list (0: all):");
        for &ef in efs {
            let r = run_batch(server, id, flat, ef, width).map(|(a, _)| check(&a, &ix.l2, &ix.l2_queries, &data.truth));
            let q = run_batch(server, id, &big, ef, width).map(|(_, secs)| 16384.0 / secs);
            match (r, q) {
                (Ok((r, None)), Ok(q)) => line += &format!(" ef {ef}: recall@10 {r:.4}, {q:.0} q/s;"),
                (Ok((_, Some(bad))), _) => line += &format!(" ef {ef}: {bad};"),
                (Err(e), _) | (_, Err(e)) => line += &format!(" ef {ef}: {e};"),
            }
        }
        println!("{line}");
    }
}

/// Queries/s by batch size (the queries repeated to fill the larger ones),
/// each size for about half a second.
fn sizes(server: &SearchServer, id: ResidentId, flat: &[f32], dim: usize, efs: &[usize]) {
    let nq = flat.len() / dim;
    for &ef in efs {
        let mut line = format!("batch ef {ef:>4} queries/s by batch size:");
        let mut parts = format!("batch ef {ef:>4} last call's ms (host submit / kernel / host collect) by size:");
        for size in [1usize, 16, 64, 256, 1024, 4096, 16384, 65536, 262144] {
            let q: Vec<f32> = flat.iter().copied().cycle().take(size * dim).collect();
            let (mut done, t) = (0usize, Instant::now());
            let mut last = None;
            while t.elapsed() < Duration::from_millis(500) {
                let ticket = match server.submit_batch(id, &q, K, ef, 0) {
                    Ok(t) => t,
                    Err(e) => {
                        line += &format!(" {size}: {e};");
                        break;
                    }
                };
                let collect = loop {
                    let tc = Instant::now();
                    match server.poll_batch(&ticket) {
                        Ok(Some(_)) => break tc.elapsed().as_secs_f64() * 1e3,
                        Ok(None) => std::thread::yield_now(),
                        Err(_) => break f64::NAN,
                    }
                };
                let (submit, kernel) = ticket.timing();
                last = Some((submit, kernel.unwrap_or(f64::NAN), collect));
                done += size;
            }
            line += &format!(" {size}: {:.0}", done as f64 / t.elapsed().as_secs_f64());
            if let (Some((s, k, c)), true) = (last, size >= 1024) {
                parts += &format!(" {size}: {s:.2}/{k:.2}/{c:.2}");
            }
        }
        println!("{line} ({nq} distinct queries)");
        println!("{parts}");
    }
}

/// One thread's single queries (the persistent kernel) while a large batch
/// runs, against the same thread's with no batch.
fn beside(server: &SearchServer, id: ResidentId, ix: &Indexes, flat: &[f32], efs: &[usize], v: &mut Verdict) {
    let ef = efs.get(1).copied().unwrap_or(20);
    let dim = ix.l2_queries[0].len();
    let singles = |stop: &dyn Fn() -> bool| -> Vec<f64> {
        let mut lat = Vec::new();
        for q in ix.l2_queries.iter().cycle() {
            if stop() || lat.len() >= 20_000 {
                break;
            }
            let t = Instant::now();
            if server.submit(id, q, K, ef).and_then(|mut tk| server.wait(&mut tk, WAIT)).is_ok() {
                lat.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        lat.sort_by(f64::total_cmp);
        lat
    };
    let p = |l: &[f64], f: f64| {
        l.get(((l.len() as f64 * f) as usize).min(l.len().saturating_sub(1))).copied().unwrap_or(f64::NAN)
    };
    let t0 = Instant::now();
    let idle = singles(&|| t0.elapsed() > Duration::from_millis(300));
    let big: Vec<f32> = flat.iter().copied().cycle().take(262_144 * dim).collect();
    let ticket = match server.submit_batch(id, &big, K, ef, 0) {
        Ok(t) => t,
        Err(e) => {
            v.check(false, format!("batch beside single queries: {e}"));
            return;
        }
    };
    let tb = Instant::now();
    let during = singles(&|| !matches!(server.poll_batch(&ticket), Ok(None)));
    let batch_secs = tb.elapsed().as_secs_f64();
    let answered = loop {
        match server.poll_batch(&ticket) {
            Ok(Some(a)) => break a.len(),
            Ok(None) => std::thread::yield_now(),
            Err(_) => break 0,
        }
    };
    v.check(
        answered == 262_144 && !during.is_empty(),
        format!(
            "single queries beside a batch of 262144 (ef {ef}, {:.0} ms): {} answered during it, p50 {:.0} us / p99 {:.0} us (idle: p50 {:.0} / p99 {:.0})",
            batch_secs * 1e3,
            during.len(),
            p(&during, 0.5),
            p(&during, 0.99),
            p(&idle, 0.5),
            p(&idle, 0.99)
        ),
    );
}
