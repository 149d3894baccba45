//! The resumable search: successive rounds hand out every live node once.

mod common;

use common::Rng;
use gpu_graph_engine::flat::FlatIndex;
use gpu_graph_engine::graph::Graph;
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::node;
use gpu_graph_engine::params::BuildParams;
use gpu_graph_engine::rnn_descent::build;
use gpu_graph_engine::search::{search, Search};
use gpu_graph_engine::store::GraphView;
use gpu_graph_engine::NO_NODE;

const N: usize = 600;
const DIM: usize = 8;

fn points() -> Vec<f32> {
    let mut rng = Rng(42);
    (0..N * DIM).map(|_| (rng.below(10_000) as f32) / 100.0).collect()
}

/// Drains a search round by round; checks each round is sorted and returns all ids.
fn drain(store: &FlatIndex, q: &[f32], ef: usize) -> Vec<u32> {
    let mut s = Search::new(store, Metric::L2, q);
    let first = s.next_round(store, ef);
    assert_eq!(first, search(store, Metric::L2, q, ef, ef), "the first round is the plain search");
    let mut all: Vec<u32> = first.iter().map(|h| h.node).collect();
    loop {
        let round = s.next_round(store, ef);
        if round.is_empty() {
            break;
        }
        assert!(round.len() <= ef);
        assert!(round.windows(2).all(|w| w[0].dist <= w[1].dist), "a round comes out sorted");
        all.extend(round.iter().map(|h| h.node));
    }
    assert!(s.next_round(store, ef).is_empty(), "stays empty");
    all
}

#[test]
fn rounds_return_every_live_node_once() {
    let v = points();
    let g = build(&v, DIM, &BuildParams { degree: 8, ..BuildParams::default() }, &mut |_, _| true).unwrap();
    let mut store = FlatIndex::new(Metric::L2, DIM, v.clone(), g);
    let deleted = [3u32, 77, 150, 151, 599];
    for &d in &deleted {
        store.flags[d as usize] = node::DELETED;
    }
    let mut rng = Rng(7);
    for ef in [1, 10, 64] {
        let q: Vec<f32> = (0..DIM).map(|_| rng.below(10_000) as f32 / 100.0).collect();
        let mut got = drain(&store, &q, ef);
        got.sort_unstable();
        let want: Vec<u32> = (0..N as u32).filter(|u| !deleted.contains(u)).collect();
        assert_eq!(got, want, "ef {ef}");
    }
}

#[test]
fn unreachable_nodes_are_swept() {
    // a graph whose second half has no edges in or out
    let v = points();
    let half = N / 2;
    let g =
        build(&v[..half * DIM], DIM, &BuildParams { degree: 8, ..BuildParams::default() }, &mut |_, _| true).unwrap();
    let mut adjacency = g.adjacency.clone();
    adjacency.resize(N * 8, NO_NODE);
    let g = Graph { degree: 8, adjacency, entry: g.entry };
    let store = FlatIndex::new(Metric::L2, DIM, v.clone(), g);
    let mut got = drain(&store, &v[..DIM], 16);
    got.sort_unstable();
    assert_eq!(got, (0..N as u32).collect::<Vec<_>>());
    assert_eq!(store.node_count() as usize, N);
}
