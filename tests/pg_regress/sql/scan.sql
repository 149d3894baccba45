-- Index scans: the planner picks the index, rows come in increasing exact
-- distance, and a WHERE filter never makes a LIMIT return fewer rows than match.
SET client_min_messages = warning;

-- a 120×120 integer grid: exact answers are known, ties broken by id
CREATE TABLE grid (id int, v real[]);
INSERT INTO grid SELECT i, ARRAY[(i / 120)::real, (i % 120)::real] FROM generate_series(0, 14399) i;
CREATE INDEX grid_l2 ON grid USING gpu_graph (v);
ANALYZE grid;

EXPLAIN (COSTS OFF) SELECT id FROM grid ORDER BY v <-> '{30.2,30.1}' LIMIT 10;
-- without ORDER BY on the operator the index is not used
EXPLAIN (COSTS OFF) SELECT id FROM grid WHERE v = '{1,1}';

SELECT id, v, round((v <-> '{30.2,30.1}')::numeric, 4) AS d
  FROM grid ORDER BY v <-> '{30.2,30.1}' LIMIT 5;

-- the index's answer equals the exact answer for 50 queries (compared by
-- distance: equidistant grid points may come in either order)
CREATE TABLE queries AS SELECT q, ARRAY[(q * 7 % 119) + 0.3, (q * 13 % 119) + 0.4]::real[] AS v
  FROM generate_series(1, 50) q;
CREATE FUNCTION knn(query real[], k int) RETURNS float8[] LANGUAGE sql AS
  $$ SELECT array_agg(d) FROM (SELECT v <-> query AS d FROM grid ORDER BY v <-> query LIMIT k) s $$;
SET enable_seqscan = off;
CREATE TEMP TABLE via_index AS SELECT q, knn(v, 10) AS ds FROM queries;
RESET enable_seqscan;
SET enable_indexscan = off;
CREATE TEMP TABLE exact AS SELECT q, knn(v, 10) AS ds FROM queries;
RESET enable_indexscan;
SELECT count(*) AS queries, count(*) FILTER (WHERE i.ds = e.ds) >= 48 AS exact_at_least_48
  FROM via_index i JOIN exact e USING (q);

-- distances come out non-decreasing, and equal to the operator's
SET enable_seqscan = off;
SELECT bool_and(d >= prev) AS non_decreasing, count(*) AS n FROM (
  SELECT d, lag(d, 1, 0::float8) OVER () AS prev FROM (
    SELECT v <-> '{10.5,40.5}' AS d FROM grid ORDER BY v <-> '{10.5,40.5}' LIMIT 40) s) t;

-- a filter that rejects most rows: the scan keeps going past ef_search
SET gpu_graph.ef_search = 10;
SELECT count(*) AS rows_returned FROM (
  SELECT id FROM grid WHERE id % 997 = 0 ORDER BY v <-> '{0,0}' LIMIT 30) s;
SELECT count(*) AS matching FROM grid WHERE id % 997 = 0;
-- asking for every row returns every row exactly once
SELECT count(*) AS all_rows, count(DISTINCT id) AS distinct_rows FROM (
  SELECT id FROM grid ORDER BY v <-> '{119,119}' LIMIT 20000) s;
-- iterative_scan = off stops after ef_search rows
SET gpu_graph.iterative_scan = off;
SELECT count(*) AS rows_returned FROM (
  SELECT id FROM grid WHERE id % 997 = 0 ORDER BY v <-> '{0,0}' LIMIT 30) s;
SET gpu_graph.iterative_scan = strict_order;
SELECT bool_and(d >= prev) AS non_decreasing FROM (
  SELECT d, lag(d, 1, 0::float8) OVER () AS prev FROM (
    SELECT v <-> '{0,0}' AS d FROM grid WHERE id % 7 = 0 ORDER BY v <-> '{0,0}' LIMIT 100) s) t;
RESET gpu_graph.iterative_scan;
RESET gpu_graph.ef_search;

-- a NULL query vector: rows come back with no order
SELECT count(*) FROM (SELECT id FROM grid ORDER BY v <-> NULL LIMIT 3) s;
RESET enable_seqscan;

-- the other two operator classes
CREATE TABLE dirs (id int, v real[]);
INSERT INTO dirs SELECT i, ARRAY[cos(i * 0.01)::real * (1 + i % 5), sin(i * 0.01)::real * (1 + i % 5)]
  FROM generate_series(0, 627) i;
CREATE INDEX dirs_cos ON dirs USING gpu_graph (v real_cosine_ops);
CREATE INDEX dirs_ip ON dirs USING gpu_graph (v real_ip_ops);
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM dirs ORDER BY v <=> '{1,0}' LIMIT 3;
SELECT id, round((v <=> '{1,0}')::numeric, 6) AS d FROM dirs ORDER BY v <=> '{1,0}' LIMIT 3;
EXPLAIN (COSTS OFF) SELECT id FROM dirs ORDER BY v <#> '{1,0}' LIMIT 3;
SELECT id, round((v <#> '{1,0}')::numeric, 4) AS d FROM dirs ORDER BY v <#> '{1,0}' LIMIT 3;
-- a query the wrong opclass cannot serve falls back to a sort
EXPLAIN (COSTS OFF) SELECT id FROM dirs ORDER BY v <-> '{1,0}' LIMIT 3;
RESET enable_seqscan;

DROP TABLE grid, queries, dirs;
DROP FUNCTION knn;
