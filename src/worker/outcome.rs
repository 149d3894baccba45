//! How a scan's first round went: answered by the worker, or why the scan
//! searched on the CPU instead. One type from end to end: the worker writes
//! it into the ring's reply, the backend counts it (one counter each), and
//! gpu_graph_worker_stats() names it.

/// Stored in shared memory (the ring's reply), hence `repr(u32)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Outcome {
    /// the worker answered
    Answered = 0,
    /// no worker serving (not started, restarting, or gone while we waited)
    Absent = 1,
    /// no free query slot (in the ring, or on the GPU)
    Busy = 2,
    /// no answer within gpu_graph.gpu_timeout
    Timeout = 3,
    /// the worker has no copy of the index at the scan's generation yet
    /// (one is being made)
    Stale = 4,
    /// the query or the index is beyond the worker's limits (an index larger
    /// than gpu_graph.gpu_memory_limit, k or ef larger than the GPU takes)
    Unfit = 5,
    /// the search failed (the worker's log says why)
    Error = 6,
}

impl Outcome {
    /// Every outcome, in counter order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Answered,
        Outcome::Absent,
        Outcome::Busy,
        Outcome::Timeout,
        Outcome::Stale,
        Outcome::Unfit,
        Outcome::Error,
    ];

    /// The name gpu_graph_worker_stats() shows.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Absent => "absent",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Stale => "stale",
            Outcome::Unfit => "unfit",
            Outcome::Error => "error",
        }
    }

    /// Its counter.
    pub fn index(self) -> usize {
        self as usize
    }
}
