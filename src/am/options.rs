//! Index options (WITH (...)) and how the index's opclass picks the metric.

use std::ffi::{c_char, CStr};

use gpu_graph_engine::cfs::{Algorithm, CfsParams};
use gpu_graph_engine::metric::Metric;
use gpu_graph_engine::params::BuildParams;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::storage::layout::Element;

static mut KIND: pg_sys::relopt_kind::Type = 0;

pub const ALGORITHMS: [&str; 5] = ["rnn_descent", "nsg", "vamana", "cagra", "tsdg"];
pub const KNN_INITS: [&str; 4] = ["auto", "random", "exact", "gnn_descent"];
pub const STORAGES: [&str; 2] = ["f32", "f16"];

#[repr(C)]
struct Options {
    vl_len_: i32,
    /// offset of the algorithm string within this struct's allocation
    algorithm: i32,
    degree: i32,
    s: i32,
    r: i32,
    t1: i32,
    t2: i32,
    rho: f64,
    /// offset of the knn string
    knn: i32,
    /// offset of the storage string
    storage: i32,
    /// CFS graphs (nsg, vamana, cagra, tsdg): Vamana's and TSDG's alpha, the
    /// candidates collected per node, TSDG's largest lambda kept
    alpha: f64,
    candidates: i32,
    lambda: i32,
}

/// ERROR unless `value` (NULL: the option is not given) is one of `valid`.
///
/// # Safety
/// `value` must be NULL or a NUL-terminated string.
unsafe fn validate_choice(option: &str, valid: &[&str], value: *const c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: a non-null `value` is a NUL-terminated string (the caller's contract).
    let v = unsafe { CStr::from_ptr(value) }.to_string_lossy();
    if !valid.contains(&v.as_ref()) {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("invalid value for gpu_graph option \"{option}\": \"{v}\""),
            format!("Valid values: {}.", valid.join(", "))
        );
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn validate_algorithm(value: *const c_char) {
    // SAFETY: PostgreSQL validates a string option's value, NULL or a C string.
    unsafe { validate_choice("algorithm", &ALGORITHMS, value) }
}

#[pg_guard]
unsafe extern "C-unwind" fn validate_knn(value: *const c_char) {
    // SAFETY: as in validate_algorithm.
    unsafe { validate_choice("knn", &KNN_INITS, value) }
}

#[pg_guard]
unsafe extern "C-unwind" fn validate_storage(value: *const c_char) {
    // SAFETY: as in validate_algorithm.
    unsafe { validate_choice("storage", &STORAGES, value) }
}

/// Registers the options; called from _PG_init.
pub fn register() {
    let d = BuildParams::default();
    let lock = pg_sys::AccessExclusiveLock as i32;
    // SAFETY: _PG_init runs once per process, on its only thread, before any
    // amoptions call reads KIND; the names and descriptions are static C
    // strings, which the reloption table keeps pointing at.
    unsafe {
        KIND = pg_sys::add_reloption_kind();
        pg_sys::add_string_reloption(
            KIND,
            c"algorithm".as_ptr(),
            c"Graph construction algorithm".as_ptr(),
            c"rnn_descent".as_ptr(),
            Some(validate_algorithm),
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"degree".as_ptr(),
            c"Neighbours kept per node".as_ptr(),
            d.degree as i32,
            8,
            128,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"s".as_ptr(),
            c"RNN-Descent: random initial neighbours".as_ptr(),
            d.s as i32,
            1,
            128,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"r".as_ptr(),
            c"RNN-Descent: candidate pool capacity".as_ptr(),
            d.r as i32,
            8,
            512,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"t1".as_ptr(),
            c"RNN-Descent: outer rounds".as_ptr(),
            d.t1 as i32,
            1,
            32,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"t2".as_ptr(),
            c"RNN-Descent: update rounds per outer round".as_ptr(),
            d.t2 as i32,
            1,
            64,
            lock,
        );
        pg_sys::add_string_reloption(
            KIND,
            c"knn".as_ptr(),
            c"Initial graph of a GPU build: auto, random, exact or gnn_descent".as_ptr(),
            c"auto".as_ptr(),
            Some(validate_knn),
            lock,
        );
        pg_sys::add_string_reloption(
            KIND,
            c"storage".as_ptr(),
            c"How the vector pages store coordinates: f16 (half the size), or f32".as_ptr(),
            c"f16".as_ptr(),
            Some(validate_storage),
            lock,
        );
        pg_sys::add_real_reloption(
            KIND,
            c"alpha".as_ptr(),
            c"vamana and tsdg: a candidate is dropped when alpha times its distance to a kept neighbour is at most its distance to the node".as_ptr(),
            DEFAULT_ALPHA,
            1.0,
            2.0,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"candidates".as_ptr(),
            c"nsg, vamana, cagra, tsdg: candidates collected per node (at least degree)".as_ptr(),
            DEFAULT_CANDIDATES,
            8,
            512,
            lock,
        );
        pg_sys::add_int_reloption(
            KIND,
            c"lambda".as_ptr(),
            c"tsdg: edges occluded by more than lambda others of their list are dropped".as_ptr(),
            DEFAULT_LAMBDA,
            0,
            128,
            lock,
        );
        pg_sys::add_real_reloption(
            KIND,
            c"rho".as_ptr(),
            c"Share of each list given reverse edges between outer rounds".as_ptr(),
            d.rho as f64,
            0.0,
            1.0,
            lock,
        );
    }
}

#[pg_guard]
pub unsafe extern "C-unwind" fn amoptions(reloptions: pg_sys::Datum, validate: bool) -> *mut pg_sys::bytea {
    let elt = |name: &'static CStr, t: pg_sys::relopt_type::Type, offset: usize| pg_sys::relopt_parse_elt {
        optname: name.as_ptr(),
        opttype: t,
        offset: offset as i32,
    };
    use pg_sys::relopt_type::*;
    let tab = [
        elt(c"algorithm", RELOPT_TYPE_STRING, std::mem::offset_of!(Options, algorithm)),
        elt(c"degree", RELOPT_TYPE_INT, std::mem::offset_of!(Options, degree)),
        elt(c"s", RELOPT_TYPE_INT, std::mem::offset_of!(Options, s)),
        elt(c"r", RELOPT_TYPE_INT, std::mem::offset_of!(Options, r)),
        elt(c"t1", RELOPT_TYPE_INT, std::mem::offset_of!(Options, t1)),
        elt(c"t2", RELOPT_TYPE_INT, std::mem::offset_of!(Options, t2)),
        elt(c"rho", RELOPT_TYPE_REAL, std::mem::offset_of!(Options, rho)),
        elt(c"knn", RELOPT_TYPE_STRING, std::mem::offset_of!(Options, knn)),
        elt(c"storage", RELOPT_TYPE_STRING, std::mem::offset_of!(Options, storage)),
        elt(c"alpha", RELOPT_TYPE_REAL, std::mem::offset_of!(Options, alpha)),
        elt(c"candidates", RELOPT_TYPE_INT, std::mem::offset_of!(Options, candidates)),
        elt(c"lambda", RELOPT_TYPE_INT, std::mem::offset_of!(Options, lambda)),
    ];
    // SAFETY: `reloptions` is the datum PostgreSQL passes (a text[] or
    // null); the table names static C strings and offsets inside Options, of
    // the size given; KIND was set by _PG_init before any index existed.
    unsafe {
        pg_sys::build_reloptions(
            reloptions,
            validate,
            KIND,
            std::mem::size_of::<Options>(),
            tab.as_ptr(),
            tab.len() as i32,
        ) as *mut pg_sys::bytea
    }
}

/// The index's options as amoptions parsed them; None when none were given.
///
/// # Safety
/// `index` must be an open gpu_graph index.
unsafe fn options<'a>(index: pg_sys::Relation) -> Option<&'a Options> {
    // SAFETY: an open index's rd_options is NULL or what amoptions built (an
    // Options, by build_reloptions), kept in the relcache entry while the
    // relation is open.
    unsafe { ((*index).rd_options as *const Options).as_ref() }
}

/// The build parameters of an index (defaults where no option was given).
///
/// # Safety
/// `index` must be an open gpu_graph index.
pub unsafe fn build_params(index: pg_sys::Relation) -> BuildParams {
    let mut p = BuildParams::default();
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    if let Some(o) = unsafe { options(index) } {
        p.degree = o.degree as usize;
        p.s = o.s as usize;
        p.r = o.r as usize;
        p.t1 = o.t1 as usize;
        p.t2 = o.t2 as usize;
        p.rho = o.rho as f32;
    }
    let bad = |msg: String| {
        ereport!(ERROR, PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, msg);
    };
    if p.r < p.degree {
        bad(format!("gpu_graph option \"r\" ({}) must be at least \"degree\" ({})", p.r, p.degree));
    }
    // RNN-Descent refines a random graph of s out-edges a node in t1 × t2
    // rounds: with fewer than 4 random edges the start is not one connected
    // graph, and with fewer than 4 rounds it is barely refined. s = 1, t1 =
    // t2 = 1 built a graph of out-degree 1 whose top 10 was wrong for every
    // query; such combinations are refused rather than built.
    if p.s < 4 {
        bad(format!("gpu_graph option \"s\" ({}) must be at least 4 for the graph to be navigable", p.s));
    }
    if p.t1 * p.t2 < 4 {
        bad(format!(
            "gpu_graph options \"t1\" × \"t2\" ({} × {}) must give at least 4 rounds for the graph to be navigable",
            p.t1, p.t2
        ));
    }
    p
}

/// Vamana's own default (DiskANN) and TSDG's for SIFT.
const DEFAULT_ALPHA: f64 = 1.2;
/// Twice the default degree: what CAGRA prunes from (its k-NN graph of 2d).
const DEFAULT_CANDIDATES: i32 = 64;
/// No edge dropped by lambda unless asked (a degree never exceeds 128).
const DEFAULT_LAMBDA: i32 = 128;

/// The graph the `algorithm` option asks for on top of RNN-Descent's: None
/// for rnn_descent itself, else the CFS parameters (`degree` the index's).
///
/// # Safety
/// `index` must be an open gpu_graph index.
pub unsafe fn cfs_params(index: pg_sys::Relation, degree: usize) -> Option<CfsParams> {
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    let name = unsafe { string_option(index, |o| o.algorithm) }.unwrap_or_default();
    // SAFETY: as above.
    let o = unsafe { options(index) };
    let alpha = o.map_or(DEFAULT_ALPHA, |o| o.alpha) as f32;
    let pool = o.map_or(DEFAULT_CANDIDATES, |o| o.candidates) as usize;
    let max_lambda = o.map_or(DEFAULT_LAMBDA, |o| o.lambda) as usize;
    let algorithm = algorithm_of(&name, alpha, max_lambda)?;
    if pool < degree {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("gpu_graph option \"candidates\" ({pool}) must be at least \"degree\" ({degree})")
        );
    }
    Some(CfsParams { algorithm, degree, pool })
}

/// The CFS algorithm of an `algorithm` value (None: rnn_descent).
pub fn algorithm_of(name: &str, alpha: f32, max_lambda: usize) -> Option<Algorithm> {
    match name {
        "nsg" => Some(Algorithm::Nsg),
        "vamana" => Some(Algorithm::Vamana { alpha }),
        "cagra" => Some(Algorithm::Cagra),
        "tsdg" => Some(Algorithm::Tsdg { alpha, max_lambda }),
        _ => None,
    }
}

/// The `knn` option: how a GPU build starts (the CPU build always starts
/// from random neighbours).
///
/// # Safety
/// `index` must be an open gpu_graph index.
pub unsafe fn knn_init(index: pg_sys::Relation) -> gpu_graph_gpu::KnnInit {
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    let text = unsafe { string_option(index, |o| o.knn) }.unwrap_or_default();
    match text.as_str() {
        "random" => gpu_graph_gpu::KnnInit::Random,
        "exact" => gpu_graph_gpu::KnnInit::Exact,
        "gnn_descent" => gpu_graph_gpu::KnnInit::Descent,
        _ => gpu_graph_gpu::KnnInit::Auto,
    }
}

/// The `storage` option: how the vector pages store coordinates.
///
/// # Safety
/// `index` must be an open gpu_graph index.
pub unsafe fn storage(index: pg_sys::Relation) -> Element {
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    let text = unsafe { string_option(index, |o| o.storage) };
    // f16 by default: measured on an H200 its recall@10 stays within 0.005
    // of f32's at ef 20/40/80 (1M x 768, 10M x 96; SIFT is exact in f16),
    // at half the pages, WAL, upload and GPU memory (docs/benchmarks.md)
    text.and_then(|t| Element::from_name(&t)).unwrap_or(Element::F16)
}

/// A string option's value, None when not given.
///
/// # Safety
/// `index` must be an open gpu_graph index.
unsafe fn string_option(index: pg_sys::Relation, offset: fn(&Options) -> i32) -> Option<String> {
    // SAFETY: `index` is an open gpu_graph index (the caller's contract).
    let o = unsafe { options(index) }?;
    let at = offset(o);
    (at != 0).then(|| {
        let p = (o as *const Options as *const c_char).wrapping_add(at as usize);
        // SAFETY: build_reloptions keeps a string option's value, NUL
        // terminated, at that offset of the same allocation.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    })
}

/// The metric of the index's operator class, from its distance function.
///
/// # Safety
/// `index` must be an open gpu_graph index.
pub unsafe fn metric(index: pg_sys::Relation) -> Metric {
    // SAFETY: `index` is an open gpu_graph index (the caller's contract), so
    // its first column has support function 1; get_func_name returns NULL
    // or a palloc'd C string.
    let name = unsafe {
        let name = pg_sys::get_func_name(pg_sys::index_getprocid(index, 1, 1));
        if name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    };
    match name.as_str() {
        "l2_distance" => Metric::L2,
        "cosine_distance" => Metric::Cosine,
        // pgvector's names for its types' <#>
        "negative_inner_product" | "vector_negative_inner_product" | "halfvec_negative_inner_product" => {
            Metric::InnerProduct
        }
        other => error!("gpu_graph: operator class uses an unknown distance function \"{other}\""),
    }
}
