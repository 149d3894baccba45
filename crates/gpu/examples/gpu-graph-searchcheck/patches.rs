//! What a patch of a resident copy costs on the host (`--patch-costs`):
//! the worker applies one for nearly every insert under writes, on the
//! thread that also takes and answers the queries. Patches shaped as an
//! insert's (a new node's row and list, one list on each of L other
//! nodes), each timed around `SearchServer::patch`, alone and with query
//! threads beside; a measurement, not a check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::node;
use gpu_graph_gpu::search::{Patch, ResidentId, SearchServer};

use crate::common::K;
use crate::WAIT;

/// Patches timed per shape.
const ROUNDS: usize = 2000;

pub fn costs(server: &SearchServer, id: ResidentId, ix: &FlatIndex, queries: &[Vec<f32>]) {
    let (n0, sd, d) = (ix.len(), ix.stored_dim, ix.graph.degree);
    let entry = ix.graph.entry.unwrap_or(0);
    let mut n = n0;
    let mut x = 0x9e3779b97f4a7c15u64;
    let mut next = move |m: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % m as u64) as usize
    };
    // (label, other lists, scattered, query threads)
    let shapes = [
        ("row + 1 list", 0, true, 0),
        ("row + 8 scattered lists", 8, true, 0),
        ("row + 35 scattered lists", 35, true, 0),
        ("row + 35 lists in one run", 35, false, 0),
        ("row + 35 scattered lists, 16 query threads", 35, true, 16),
        ("row + 35 scattered lists, 64 query threads", 35, true, 64),
    ];
    for (label, others, scattered, threads) in shapes {
        let stop = AtomicBool::new(false);
        let mut times: Vec<Duration> = Vec::with_capacity(ROUNDS);
        let answered = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let stop = &stop;
                    s.spawn(move || {
                        let mut done = 0usize;
                        let mut i = t;
                        while !stop.load(Ordering::Relaxed) {
                            let q = &queries[i % queries.len()];
                            if let Ok(mut tk) = server.submit(id, q, K, 20) {
                                if server.wait(&mut tk, WAIT).is_ok() {
                                    done += 1;
                                }
                            }
                            i += threads;
                        }
                        done
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(100));
            let t0 = Instant::now();
            for _ in 0..ROUNDS {
                // the new node: another's vector and list
                let src = next(n0);
                let row = (n as u32, vec![node::LIVE], ix.vectors[src * sd..(src + 1) * sd].to_vec());
                let mut lists = vec![(n as u32, ix.graph.adjacency[src * d..(src + 1) * d].to_vec())];
                if scattered {
                    lists.extend((0..others).map(|_| {
                        let u = next(n0);
                        (u as u32, ix.graph.adjacency[u * d..(u + 1) * d].to_vec())
                    }));
                } else if others > 0 {
                    let u = next(n0 - others);
                    lists.push((u as u32, ix.graph.adjacency[u * d..(u + others) * d].to_vec()));
                }
                let p = Patch { n: n + 1, entry, rows: vec![row], lists, payloads: Vec::new() };
                let t = Instant::now();
                match server.patch(id, &p) {
                    Ok(true) => {}
                    other => {
                        println!("patch costs: {label}: the patch failed ({other:?})");
                        break;
                    }
                }
                times.push(t.elapsed());
                n += 1;
            }
            let secs = t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            let done: usize = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
            done as f64 / secs
        });
        times.sort();
        let us = |q: f64| {
            times
                .get(((times.len() as f64 * q) as usize).min(times.len().saturating_sub(1)))
                .map_or(0.0, |t| t.as_secs_f64() * 1e6)
        };
        let mean = times.iter().map(|t| t.as_secs_f64()).sum::<f64>() / times.len().max(1) as f64 * 1e6;
        println!(
            "patch costs: {label}: mean {mean:.1} us, p50 {:.1}, p90 {:.1}, p99 {:.1} ({} patches{})",
            us(0.5),
            us(0.9),
            us(0.99),
            times.len(),
            if threads > 0 { format!(", {answered:.0} queries/s beside") } else { String::new() }
        );
    }
}
