-- Routing to the search worker without one: pg_regress runs without
-- shared_preload_libraries, so no worker runs and every scan searches on
-- the CPU, counted per backend. (tests/cluster/worker.sh runs the worker.)
SET client_min_messages = warning;
CREATE TABLE wgrid (id int, v real[]);
INSERT INTO wgrid SELECT i, ARRAY[(i / 50)::real, (i % 50)::real] FROM generate_series(0, 2499) i;
CREATE INDEX wgrid_idx ON wgrid USING gpu_graph (v);
SHOW gpu_graph.search_device;
SHOW gpu_graph.gpu_timeout;
SHOW gpu_graph.gpu_memory_limit;
SELECT gpu_graph_worker_stats()->'scope' AS scope, gpu_graph_worker_stats()->'worker' AS worker;
SELECT gpu_graph_info('wgrid_idx')->'search' AS search;

SET enable_seqscan = off;
-- auto: no worker configured, the CPU searches; no fallback counted
SELECT array_agg(id) AS auto FROM (SELECT id FROM wgrid ORDER BY v <-> '{20.2,30.1}' LIMIT 5) s;
-- gpu: asks for the worker, finds none, searches on the CPU: same rows
SET gpu_graph.search_device = gpu;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM wgrid ORDER BY v <-> '{20.2,30.1}' LIMIT 5) s;
SET gpu_graph.search_device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM wgrid ORDER BY v <-> '{20.2,30.1}' LIMIT 5) s;
SELECT s->'scans' AS scans, s->'fallbacks' AS fallbacks FROM gpu_graph_worker_stats() s;
-- the latency breakdown starts over; the counters go on (no worker: the
-- backend's own, no scan served, so the breakdown is empty either way)
SELECT gpu_graph_worker_latency_reset();
SELECT s->'latency_us'->'roundtrip' AS roundtrip, s->'scans'->'cpu' AS cpu FROM gpu_graph_worker_stats() s;
RESET gpu_graph.search_device;
RESET enable_seqscan;

-- bad values; the test switches are for superusers only
SET gpu_graph.search_device = sometimes;
SET gpu_graph.gpu_timeout = 0;
CREATE ROLE gpu_graph_worker_user;
SET ROLE gpu_graph_worker_user;
SET gpu_graph.inject_fault = on;
SET gpu_graph.worker_delay = 100;
SET gpu_graph.search_device = gpu;
-- the reset is a superuser's unless granted (as pg_stat_reset)
SELECT gpu_graph_worker_latency_reset();
RESET ROLE;
DROP ROLE gpu_graph_worker_user;
DROP TABLE wgrid;
