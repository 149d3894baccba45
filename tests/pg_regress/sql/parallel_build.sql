-- CREATE INDEX scans the heap with parallel workers when PostgreSQL grants
-- them (max_parallel_maintenance_workers, the table's parallel_workers):
-- every row indexed once, NULLs and zero vectors skipped as in a serial
-- build, the same answers, and a bad row found by any process is the same
-- ERROR naming it.
SET client_min_messages = warning;
-- plan_create_index_workers wants 32 MB of maintenance_work_mem a process
SET maintenance_work_mem = '256MB';
SET min_parallel_table_scan_size = 0;

CREATE TABLE par (id int, v real[]);
ALTER TABLE par SET (parallel_workers = 2);
INSERT INTO par SELECT i, ARRAY[sin(i), cos(i * 1.3), sin(i * 0.7), cos(i * 0.11)]::real[]
  FROM generate_series(1, 40000) i;
-- cosine skips zero vectors; nobody indexes NULLs
INSERT INTO par VALUES (40001, NULL), (40002, NULL), (40003, '{0,0,0,0}');

SET max_parallel_maintenance_workers = 2;
-- f32 pages: the answers below are compared with the exact ones in order
CREATE INDEX par_parallel ON par USING gpu_graph (v real_cosine_ops) WITH (storage = 'f32');
SET max_parallel_maintenance_workers = 0;
CREATE INDEX par_serial ON par USING gpu_graph (v real_cosine_ops) WITH (storage = 'f32');
RESET max_parallel_maintenance_workers;

-- the parallel build used workers; both indexed the 40000 rows once
SELECT i, (gpu_graph_info(i)->'build'->>'scan_workers')::int > 0 AS parallel,
       gpu_graph_info(i)->'build'->'rows' AS rows, gpu_graph_info(i)->'nodes'->'live' AS live
  FROM unnest(ARRAY['par_parallel', 'par_serial']::regclass[]) i;
-- inner product: the leader scans its share too (a row's stored form waits
-- for the largest norm); L2 with f16 pages, whose leader writes the pages
-- while the workers scan, as cosine above
SET max_parallel_maintenance_workers = 2;
CREATE INDEX par_ip ON par USING gpu_graph (v real_ip_ops);
CREATE INDEX par_l2 ON par USING gpu_graph (v);
-- CONCURRENTLY: the scan's registered snapshot, the same rows
CREATE INDEX CONCURRENTLY par_cic ON par USING gpu_graph (v);
RESET max_parallel_maintenance_workers;
SELECT i, (gpu_graph_info(i)->'build'->>'scan_workers')::int > 0 AS parallel,
       gpu_graph_info(i)->'nodes'->'live' AS live
  FROM unnest(ARRAY['par_ip', 'par_l2', 'par_cic']::regclass[]) i;
DROP INDEX par_ip, par_l2, par_cic;

-- the same answers as the exact ones, for 20 queries at a generous ef_search
CREATE TABLE par_q AS SELECT q, ARRAY[cos(q), sin(q * 2.1), cos(q * 0.3), sin(q)]::real[] AS v
  FROM generate_series(1, 20) q;
CREATE FUNCTION par_knn(query real[]) RETURNS int[] LANGUAGE sql AS
  $$ SELECT array_agg(id ORDER BY d, id) FROM
     (SELECT id, v <=> query AS d FROM par WHERE v IS NOT NULL ORDER BY v <=> query LIMIT 10) s $$;
SET gpu_graph.ef_search = 200;
SET enable_seqscan = off;
DROP INDEX par_serial;
CREATE TEMP TABLE via_parallel AS SELECT q, par_knn(v) AS ids FROM par_q;
RESET enable_seqscan;
SET enable_indexscan = off;
SET enable_bitmapscan = off;
CREATE TEMP TABLE exact AS SELECT q, par_knn(v) AS ids FROM par_q;
RESET enable_indexscan;
RESET enable_bitmapscan;
SELECT count(*) FILTER (WHERE p.ids = e.ids) >= 19 AS parallel_exact_at_least_19
  FROM via_parallel p JOIN exact e USING (q);

-- a row of the wrong dimension near the end: the ERROR names it, whichever
-- process reads it (terse: a worker's ERROR comes with a CONTEXT line)
DROP INDEX par_parallel;
INSERT INTO par VALUES (40004, '{1,2,3}');
\set VERBOSITY terse
SET max_parallel_maintenance_workers = 2;
CREATE INDEX par_bad ON par USING gpu_graph (v);
\set VERBOSITY default
DROP TABLE par, par_q;
DROP FUNCTION par_knn;
