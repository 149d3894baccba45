//! The server beyond the plain search: the inner-product index, two indexes
//! at once, deletes, Busy, abandoned tickets, unload and bad arguments.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_graph_engine::dataset::Matrix;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::node;
use gpu_graph_engine::recall::exact_knn;
use gpu_graph_engine::NO_NODE;
use gpu_graph_gpu::search::{Patch, ResidentId, SearchError, SearchServer};

use crate::common::{cpu_recall, Data, Verdict, K};
use crate::{check_answer, score, Indexes, WAIT};

pub fn run(
    server: &SearchServer,
    (id, ip_id): (ResidentId, ResidentId),
    ix: &Indexes,
    data: &Data,
    efs: &[usize],
    v: &mut Verdict,
) {
    let ef = *efs.iter().max().unwrap_or(&64);
    inner_product(server, ip_id, ix, data, ef, v);
    far_coordinate(server, ix, data, ef, v);
    held(server, id, ix, data, ef, v);
    two_at_once(server, (id, ip_id), ix, v);
    deletes(server, id, ix, data, v);
    grows(server, ix, data, ef, v);
    busy_and_abandoned(server, id, ix, v);
    unload_and_bad_arguments(server, (id, ip_id), ix, v);
}

/// Rows patched in past a copy's room (the worker's copy under inserts):
/// the copy grows on the device, keeps its id, and answers right, as well
/// as the CPU does on the whole graph. A copy of the first 80% of the rows
/// (their lists without the later nodes) takes the rest and every list in
/// one patch, far past its room.
fn grows(server: &SearchServer, ix: &Indexes, data: &Data, ef: usize, v: &mut Verdict) {
    let full = &ix.l2;
    let (n, sd, d) = (full.len(), full.stored_dim, full.graph.degree);
    let first = n * 4 / 5;
    let entry = full.graph.entry.filter(|&e| (e as usize) < first).unwrap_or(0);
    let lists = full.graph.adjacency[..first * d].iter().map(|&u| if (u as usize) < first { u } else { NO_NODE });
    let graph = Graph { degree: d, adjacency: lists.collect(), entry: Some(entry) };
    let prefix = FlatIndex::new(Metric::L2, sd, full.vectors[..first * sd].to_vec(), graph);
    let id = match server.load(&prefix) {
        Ok(id) => id,
        Err(e) => {
            v.check(false, format!("growing: loading {first} rows: {e}"));
            return;
        }
    };
    let before = server.resident_info(id).map(|i| i.bytes).unwrap_or(0);
    let patch = Patch {
        n,
        entry: full.graph.entry.unwrap_or(0),
        rows: vec![(first as u32, vec![node::LIVE; n - first], full.vectors[first * sd..].to_vec())],
        lists: vec![(0, full.graph.adjacency.clone())],
        payloads: Vec::new(),
    };
    let t = Instant::now();
    let grew = server.patch(id, &patch);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let after = server.resident_info(id);
    let (cr, _) = cpu_recall(full, Metric::L2, &data.queries, &data.truth, ef);
    let (r, bad) = answers(server, id, full, &ix.l2_queries, &data.truth, ef);
    let _ = server.unload(id);
    v.check(
        matches!(grew, Ok(true)) && after.as_ref().is_some_and(|i| i.n == n && i.bytes > before) && bad.is_none() && r >= cr - 0.01,
        format!(
            "growing: {first} rows loaded ({} MiB), {} patched in ({grew:?}, {ms:.1} ms, {} MiB now): recall@10 {r:.4} at ef {ef} (cpu {cr:.4}){}",
            before >> 20,
            n - first,
            after.map_or(0, |i| i.bytes >> 20),
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );
}

/// Every query once on resident `id` (a copy of `index`), each answer
/// checked against `index`: recall@10 against `truth`, the first bad answer.
fn answers(
    server: &SearchServer,
    id: ResidentId,
    index: &FlatIndex,
    queries: &[Vec<f32>],
    truth: &[Vec<(u32, f64)>],
    ef: usize,
) -> (f64, Option<String>) {
    let hits: Vec<Result<Vec<(f32, u32)>, String>> = queries
        .iter()
        .map(|q| server.submit(id, q, K, ef).and_then(|mut t| server.wait(&mut t, WAIT)).map(|a| a.hits))
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    score(hits.iter().map(|r| r.as_deref().map_err(Clone::clone)), index, queries, truth)
}

/// A query far from every row in one coordinate: the L2 index's rows with
/// coordinate 0 at -32,768 and the first 100 queries with it at +32,768
/// (both exact in fp16, 65,536 apart: past fp16's 65,504), the rest as
/// they are; the same graph, the exact nearest by brute force. The tensor
/// cores measure halved differences, so every answer's distance is finite
/// and the host's own (check_answer); a plain x - q was infinite, every
/// row infinitely far (-DGG_Q_EACH_PASS keeps that kernel: this check
/// fails there).
fn far_coordinate(server: &SearchServer, ix: &Indexes, data: &Data, ef: usize, v: &mut Verdict) {
    const FAR: f32 = 32_768.0;
    let full = &ix.l2;
    let (sd, dim) = (full.stored_dim, data.queries.dim);
    if sd != dim || full.vectors.iter().any(|x| x.abs() > 30_000.0) {
        println!("skip far coordinate: rows of {sd} stored values for {dim} dimensions, or values past 30,000");
        return;
    }
    let mut rows = full.vectors.clone();
    rows.chunks_mut(sd).for_each(|r| r[0] = -FAR);
    let far = FlatIndex::new(Metric::L2, sd, rows, full.graph.clone());
    let nq = data.queries.len().min(100);
    let mut qs = data.queries.data[..nq * dim].to_vec();
    qs.chunks_mut(dim).for_each(|q| q[0] = FAR);
    let queries = Matrix { dim, data: qs };
    let truth = exact_knn(&far.vectors, sd, &queries.data, K, Metric::L2);
    let prepared: Vec<Vec<f32>> = (0..nq).map(|q| Metric::L2.prepare_query(queries.row(q))).collect();
    let id = match server.load(&far) {
        Ok(id) => id,
        Err(e) => {
            v.check(false, format!("far coordinate: loading: {e}"));
            return;
        }
    };
    let half = server.resident_info(id).is_some_and(|i| i.half);
    let (cr, _) = cpu_recall(&far, Metric::L2, &queries, &truth, ef);
    let (r, bad) = answers(server, id, &far, &prepared, &truth, ef);
    let _ = server.unload(id);
    v.check(
        bad.is_none() && r >= cr - 0.02,
        format!(
            "far coordinate (65,536 apart, fp16 {half}): recall@10 {r:.4} at ef {ef} over {nq} queries (cpu {cr:.4}){}",
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );
}

/// The inner-product index against the CPU on the same graph.
fn inner_product(server: &SearchServer, ip_id: ResidentId, ix: &Indexes, data: &Data, ef: usize, v: &mut Verdict) {
    let (cr, _) = cpu_recall(&ix.ip, Metric::InnerProduct, &data.queries, &ix.ip_truth, ef);
    let (r, bad) = answers(server, ip_id, &ix.ip, &ix.ip_queries, &ix.ip_truth, ef);
    let half = server.resident_info(ip_id).is_some_and(|i| i.half);
    v.check(
        bad.is_none() && r >= cr - 0.01,
        format!(
            "inner product index ({} rows, fp16 {half}): recall@10 {r:.4} at ef {ef} (cpu {cr:.4}){}",
            ix.ip.len(),
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );
}

/// Queries held and sent together (the worker's way: a loop's queries in
/// two driver calls), in rounds of up to 48 on one thread: every answer
/// checked, recall as one query at a time; and the host's time to submit
/// a query both ways.
fn held(server: &SearchServer, id: ResidentId, ix: &Indexes, data: &Data, ef: usize, v: &mut Verdict) {
    const ROUND: usize = 48;
    let (cr, _) = answers(server, id, &ix.l2, &ix.l2_queries, &data.truth, ef);
    let (mut hits, mut submit_us) = (Vec::with_capacity(ix.l2_queries.len()), 0.0);
    for round in ix.l2_queries.chunks(ROUND) {
        let t = Instant::now();
        let tickets: Vec<_> = round.iter().map(|q| server.submit_held(id, q, K, ef)).collect();
        let sent = server.send_held();
        submit_us += t.elapsed().as_secs_f64() * 1e6;
        if let Err(e) = sent {
            v.check(false, format!("held queries: sending them: {e}"));
            return;
        }
        for t in tickets {
            hits.push(t.and_then(|mut t| server.wait(&mut t, WAIT)).map(|a| a.hits).map_err(|e| e.to_string()));
        }
    }
    let mut single_us = 0.0;
    for round in ix.l2_queries.chunks(ROUND) {
        let t = Instant::now();
        let tickets: Vec<_> = round.iter().map(|q| server.submit(id, q, K, ef)).collect();
        single_us += t.elapsed().as_secs_f64() * 1e6;
        for t in tickets {
            let _ = t.and_then(|mut t| server.wait(&mut t, WAIT));
        }
    }
    let nq = ix.l2_queries.len();
    let (r, bad) = score(hits.iter().map(|r| r.as_deref().map_err(Clone::clone)), &ix.l2, &ix.l2_queries, &data.truth);
    v.check(
        bad.is_none() && r >= cr - 0.01,
        format!(
            "held queries ({nq} in rounds of {ROUND}): recall@10 {r:.4} at ef {ef} (one at a time {cr:.4}); submit {:.2} us a query held, {:.2} us one at a time{}",
            submit_us / nq as f64,
            single_us / nq as f64,
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );
}

/// Both indexes at once, 32 threads, every answer checked.
fn two_at_once(server: &SearchServer, (id, ip_id): (ResidentId, ResidentId), ix: &Indexes, v: &mut Verdict) {
    let (errs, cnt) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let first_bad = std::sync::Mutex::new(None);
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..32 {
            let (errs, cnt, first_bad) = (&errs, &cnt, &first_bad);
            s.spawn(move || {
                for i in 0..200 {
                    let qi = (th * 200 + i) % ix.l2_queries.len();
                    let (rid, q, index) = if (th + i) % 2 == 0 {
                        (id, &ix.l2_queries[qi], &ix.l2)
                    } else {
                        (ip_id, &ix.ip_queries[qi], &ix.ip)
                    };
                    let bad = match server.submit(rid, q, K, 40).and_then(|mut t| server.wait(&mut t, WAIT)) {
                        Ok(a) => check_answer(&a.hits, index, K, q, None),
                        Err(e) => Some(e.to_string()),
                    };
                    match bad {
                        None => cnt.fetch_add(1, Ordering::Relaxed),
                        Some(why) => {
                            let which = if index.metric == ix.l2.metric { "l2" } else { "inner product" };
                            first_bad.lock().unwrap().get_or_insert(format!("{which} query {qi}: {why}"));
                            errs.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            });
        }
    });
    let (c, e) = (cnt.load(Ordering::Relaxed), errs.load(Ordering::Relaxed));
    let qps = c as f64 / t.elapsed().as_secs_f64();
    let first = first_bad.into_inner().unwrap().map(|b| format!(" (first: {b})")).unwrap_or_default();
    v.check(e == 0, format!("two indexes at once: {c} answers checked, {e} bad{first}, {qps:.0} queries/s"));
}

/// The 3 nearest of the first 200 queries and every 20th node deleted:
/// never returned once update_flags returned.
fn deletes(server: &SearchServer, id: ResidentId, ix: &Indexes, data: &Data, v: &mut Verdict) {
    let n = ix.l2.len();
    let mut del = vec![false; n];
    for t in data.truth.iter().take(200) {
        for &(x, _) in t.iter().take(3) {
            del[x as usize] = true;
        }
    }
    for x in (0..n).step_by(20) {
        del[x] = true;
    }
    let t = Instant::now();
    // one by one for the first 100, the rest in one batch
    let flagged: Vec<u32> = (0..n as u32).filter(|&x| del[x as usize]).collect();
    let mut ok = flagged.iter().take(100).all(|&x| server.update_flags(id, x, node::DELETED).is_ok());
    let rest: Vec<(u32, u8)> = flagged.iter().skip(100).map(|&x| (x, node::DELETED)).collect();
    ok &= server.update_flags_batch(id, &rest).is_ok();
    let upd_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut bad = None;
    for (qi, q) in ix.l2_queries.iter().enumerate().take(200) {
        match server.submit(id, q, K, 64).and_then(|mut t| server.wait(&mut t, WAIT)) {
            Ok(a) if a.hits.len() != K => {
                bad.get_or_insert(format!("query {qi}: {} hits", a.hits.len()));
            }
            Ok(a) => {
                if let Some(e) = check_answer(&a.hits, &ix.l2, K, q, Some(&del)) {
                    bad.get_or_insert(format!("query {qi}: {e}"));
                }
            }
            Err(e) => {
                bad.get_or_insert(format!("query {qi}: {e}"));
            }
        }
    }
    let undo: Vec<(u32, u8)> = flagged.iter().map(|&x| (x, node::LIVE)).collect();
    ok &= server.update_flags_batch(id, &undo).is_ok();
    v.check(
        ok && bad.is_none(),
        format!(
            "deletes: {} nodes flagged ({upd_ms:.0} ms), 200 queries never returned one{}",
            flagged.len(),
            bad.map(|b| format!("; {b}")).unwrap_or_default()
        ),
    );
}

/// Every slot held: the next submit is Busy; dropped tickets come back.
fn busy_and_abandoned(server: &SearchServer, id: ResidentId, ix: &Indexes, v: &mut Verdict) {
    let slots = server.info().slots;
    let q = &ix.l2_queries;
    let (mut held, mut first_err) = (Vec::new(), None);
    for _ in 0..slots {
        match server.submit(id, &q[0], K, 20) {
            Ok(t) => held.push(t),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let busy = server.submit(id, &q[0], K, 20);
    let answered = held.iter_mut().map(|t| server.wait(t, WAIT)).filter(Result::is_ok).count();
    v.check(
        first_err.is_none() && matches!(busy, Err(SearchError::Busy)) && answered == slots,
        format!(
            "all {slots} slots held: next submit {:?}; {answered} answered{}",
            busy.err(),
            first_err.map(|e| format!("; {e}")).unwrap_or_default()
        ),
    );
    drop(held);
    for i in 0..3 * slots {
        match server.submit(id, &q[i % q.len()], K, 40) {
            Ok(t) => drop(t),
            Err(SearchError::Busy) => std::thread::sleep(Duration::from_micros(50)),
            Err(e) => {
                v.check(false, format!("abandon: {e}"));
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    server.reclaim();
    let mut held: Vec<_> = (0..slots).filter_map(|_| server.submit(id, &q[1], K, 20).ok()).collect();
    let got = held.len();
    for t in held.iter_mut() {
        let _ = server.wait(t, WAIT);
    }
    v.check(got == slots, format!("abandoned tickets: {got} of {slots} slots free again afterwards"));
}

fn unload_and_bad_arguments(
    server: &SearchServer,
    (id, ip_id): (ResidentId, ResidentId),
    ix: &Indexes,
    v: &mut Verdict,
) {
    let b = server.resident_info(ip_id).map_or(0, |i| i.bytes);
    // a query and a batch this thread holds unpolled, as the search worker
    // holds its own between polls: the unload must not wait for them
    let held = server.submit(ip_id, &ix.ip_queries[0], K, 20);
    let held_batch = server.submit_batch(ip_id, &ix.ip_queries[..64].concat(), K, 20, 0);
    let t = Instant::now();
    let r = server.unload(ip_id);
    let took = t.elapsed();
    let after = server.submit(ip_id, &ix.ip_queries[0], K, 20);
    v.check(
        r.is_ok()
            && took < Duration::from_secs(1)
            && server.resident_info(ip_id).is_none()
            && matches!(after, Err(SearchError::Invalid(_))),
        format!(
            "unload: {r:?} ({} MiB) in {:.1} ms with a query and a batch of its own thread unpolled, a query on it then: {:?}",
            b >> 20,
            took.as_secs_f64() * 1e3,
            after.err()
        ),
    );
    // the held ones end (answered, or told the index is gone) and let go
    let query = held.map_err(|e| e.to_string()).and_then(|mut t| server.wait(&mut t, WAIT).map_err(|e| e.to_string()));
    let batch = held_batch.map_err(|e| e.to_string()).and_then(|b| {
        let t0 = Instant::now();
        loop {
            match server.poll_batch(&b) {
                Ok(Some(a)) => break Ok(a.len()),
                Ok(None) if t0.elapsed() < WAIT => std::thread::yield_now(),
                Ok(None) => break Err("no answer".to_string()),
                Err(e) => break Err(e.to_string()),
            }
        }
    });
    let healthy = server.health().is_ok();
    v.check(
        healthy && !matches!(&batch, Err(e) if e == "no answer"),
        format!(
            "after the unload: the held query {:?}, the held batch {:?}, server usable {healthy}",
            query.map(|a| a.hits.len()),
            batch
        ),
    );
    let r1 = server.submit(id, &ix.l2_queries[0][..5], K, 20);
    let r2 = server.submit(id, &ix.l2_queries[0], 100_000, 20);
    v.check(
        matches!(r1, Err(SearchError::Invalid(_))) && matches!(r2, Err(SearchError::Invalid(_))),
        format!("bad arguments refused: {:?} / {:?}", r1.err(), r2.err()),
    );
}
