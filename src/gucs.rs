//! Settings (GUCs) a session can change.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// The search beam: results kept per search round.
pub static EF_SEARCH: GucSetting<i32> = GucSetting::<i32>::new(40);

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

pub fn register() {
    GucRegistry::define_int_guc(
        c"gpu_graph.ef_search",
        c"Search beam of gpu_graph index scans.",
        c"Results kept per search round; higher gives better recall and slower queries.",
        &EF_SEARCH,
        1,
        1000,
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
}
