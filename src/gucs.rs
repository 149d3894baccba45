//! Settings (GUCs) a session can change.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// The search beam: results kept per search round.
pub static EF_SEARCH: GucSetting<i32> = GucSetting::<i32>::new(40);
/// Its largest value; also the most results a worker's answer carries.
pub const EF_SEARCH_MAX: i32 = 1000;

#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum IterativeScan {
    /// stop after the first ef_search results
    #[name = c"off"]
    Off,
    /// keep searching while the executor wants rows; each round sorted
    #[name = c"relaxed_order"]
    RelaxedOrder,
    /// keep searching, but never return a row nearer than one already returned
    #[name = c"strict_order"]
    StrictOrder,
}

#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum BuildDevice {
    /// the GPU when a usable one is found, else the CPU (with a WARNING)
    #[name = c"auto"]
    Auto,
    /// the GPU or an ERROR
    #[name = c"gpu"]
    Gpu,
    #[name = c"cpu"]
    Cpu,
}

pub static BUILD_DEVICE: GucSetting<BuildDevice> = GucSetting::<BuildDevice>::new(BuildDevice::Auto);

pub static ITERATIVE_SCAN: GucSetting<IterativeScan> = GucSetting::<IterativeScan>::new(IterativeScan::RelaxedOrder);

#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum SearchDevice {
    /// the search worker when one runs, else the CPU
    #[name = c"auto"]
    Auto,
    /// the search worker; the CPU only as a (counted) fallback
    #[name = c"gpu"]
    Gpu,
    #[name = c"cpu"]
    Cpu,
}

pub static SEARCH_DEVICE: GucSetting<SearchDevice> = GucSetting::<SearchDevice>::new(SearchDevice::Auto);
/// Milliseconds a scan waits for the worker's answer before searching on the CPU.
pub static GPU_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(100);
/// Entries of each neighbour list a batch searches; 0 = the index's choice.
pub static BATCH_PREFIX: GucSetting<i32> = GucSetting::<i32>::new(0);
/// Microseconds a scan polls its slot (yielding its core between looks)
/// before sleeping on its latch. 1000 rather than 200: beside 5,000
/// inserts/s at 64 clients 5-11% more queries on a 16-core H200 and 7-8%
/// on a 32-core host, the same read-only and at 16 clients
/// (docs/benchmarks.md, "Polling longer").
pub static WORKER_SPIN: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Megabytes of device memory a GPU build may use before it builds in
/// shards; 0 = the device's free memory less a margin.
pub static BUILD_GPU_MEMORY: GucSetting<i32> = GucSetting::<i32>::new(0);
/// GPUs a paged build deals its shards out to.
pub static BUILD_GPUS: GucSetting<i32> = GucSetting::<i32>::new(1);
/// Megabytes of index copies the worker keeps; 0 = automatic.
pub static GPU_MEMORY_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(0);
/// Test switch: the next worker request makes the worker fail.
pub static INJECT_FAULT: GucSetting<bool> = GucSetting::<bool>::new(false);
/// Test switch: the worker holds this session's answers this many ms.
pub static WORKER_DELAY: GucSetting<i32> = GucSetting::<i32>::new(0);

/// A switch that may also be left to gpu_graph: gpu_graph.worker (auto:
/// when a GPU device node exists, or worker_device = cpu) and
/// gpu_graph.worker_core (auto: see worker::own_core).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Switch {
    #[name = c"auto"]
    Auto,
    #[name = c"on"]
    On,
    #[name = c"off"]
    Off,
}

#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum WorkerDevice {
    #[name = c"gpu"]
    Gpu,
    /// test mode: the worker answers with the engine's CPU search
    #[name = c"cpu"]
    Cpu,
}

pub static WORKER_CORE: GucSetting<Switch> = GucSetting::<Switch>::new(Switch::Auto);
pub static WORKER: GucSetting<Switch> = GucSetting::<Switch>::new(Switch::Auto);
pub static WORKER_DEVICE: GucSetting<WorkerDevice> = GucSetting::<WorkerDevice>::new(WorkerDevice::Gpu);
/// Query slots of the shared-memory ring.
pub static WORKER_SLOTS: GucSetting<i32> = GucSetting::<i32>::new(128);

pub fn register() {
    GucRegistry::define_int_guc(
        c"gpu_graph.ef_search",
        c"Search beam of gpu_graph index scans.",
        c"Results kept per search round; higher gives better recall and slower queries.",
        &EF_SEARCH,
        1,
        EF_SEARCH_MAX,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"gpu_graph.build_device",
        c"Where CREATE INDEX builds the graph: auto, gpu or cpu.",
        c"auto uses a GPU when one is usable and falls back to the CPU with a WARNING that says why; \
          gpu makes that an ERROR; cpu never touches CUDA.",
        &BUILD_DEVICE,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"gpu_graph.iterative_scan",
        c"Whether a gpu_graph scan continues past ef_search results when the executor asks for more.",
        c"relaxed_order (default) keeps returning rows, each round in increasing distance; strict_order \
          drops rows nearer than one already returned; off stops after ef_search rows.",
        &ITERATIVE_SCAN,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"gpu_graph.search_device",
        c"Where gpu_graph index scans search: auto, gpu or cpu.",
        c"auto asks the search worker when one runs and searches on the CPU otherwise; gpu always asks the \
          worker and counts every CPU fallback (see gpu_graph_worker_stats()); cpu never asks it.",
        &SEARCH_DEVICE,
        GucContext::Userset,
        GucFlags::EXPLAIN,
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.gpu_timeout",
        c"How long a scan waits for the search worker before searching on the CPU itself.",
        c"",
        &GPU_TIMEOUT,
        1,
        3_600_000,
        GucContext::Userset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.batch_prefix",
        c"Entries of each neighbour list gpu_graph_search_batch searches.",
        c"0 = the index's choice: half the degree on a tsdg index (its lists are ordered so that a prefix \
          is a good smaller list), whole lists on the others. ORDER BY scans always search whole lists.",
        &BATCH_PREFIX,
        0,
        256,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"gpu_graph.worker_core",
        c"Whether the search worker keeps a core to itself, which the backends that ask it keep off.",
        c"The worker's main thread polls without sleeping; sharing the cores with the backends it waited \
          for one up to a third of the time under writes. auto: when it searches on a GPU and may run on \
          8 cores or more; on: on 2 or more; off: never. It keeps the last core it may run on.",
        &WORKER_CORE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.worker_spin",
        c"Microseconds a scan waiting for the search worker polls its answer before it sleeps on its latch.",
        c"An answer seen while polling needs no wake-up signal from the worker and no sleep; the scan yields \
          its core between two looks, so other processes that can run do. 0 = sleep at once.",
        &WORKER_SPIN,
        0,
        10_000,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.build_gpu_memory",
        c"Device memory a GPU build of the graph may use; a larger build is made in shards that fit.",
        c"0 = automatic: the GPU's free memory when the build starts, less 5% and 256 MB.",
        &BUILD_GPU_MEMORY,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.build_gpus",
        c"GPUs (devices 0 to n - 1) a build from the index's pages deals its shards out to.",
        c"Devices that do not open are left out; each holds one shard's rows on the host while it builds.",
        &BUILD_GPUS,
        1,
        64,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.gpu_memory_limit",
        c"Memory the search worker may use for index copies; least recently used copies are evicted.",
        c"0 = automatic: the GPU's free memory less 1 GB when the worker starts (worker_device = gpu), \
          no limit with worker_device = cpu.",
        &GPU_MEMORY_LIMIT,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_bool_guc(
        c"gpu_graph.inject_fault",
        c"Test only: the search worker fails on this session's next request.",
        c"With worker_device = gpu the worker makes its kernel fault (a poisoned CUDA context); with cpu it \
          raises an error. Either way it exits and the postmaster restarts it.",
        &INJECT_FAULT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.worker_delay",
        c"Test only: the search worker holds this session's answers this long.",
        c"",
        &WORKER_DELAY,
        0,
        3_600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
}

/// The settings fixed at server start. PostgreSQL allows PGC_POSTMASTER
/// settings only while shared_preload_libraries loads (a later definition is
/// a FATAL error), so these exist only when gpu_graph is preloaded.
pub fn register_postmaster() {
    GucRegistry::define_enum_guc(
        c"gpu_graph.worker",
        c"Whether the GPU search worker starts: auto, on or off.",
        c"auto starts it when a GPU device node (/dev/nvidiactl, /dev/nvidia0) exists or when \
          gpu_graph.worker_device = cpu. Needs gpu_graph in shared_preload_libraries.",
        &WORKER,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_enum_guc(
        c"gpu_graph.worker_device",
        c"What the search worker searches with: gpu, or cpu (a test mode: the same protocol, the engine's CPU search).",
        c"",
        &WORKER_DEVICE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"gpu_graph.worker_slots",
        c"Query slots of the search worker's shared-memory ring: the most scans waiting on it at once.",
        c"A scan that finds no free slot searches on the CPU.",
        &WORKER_SLOTS,
        1,
        4096,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}
