-- gpu_graph_search_batch: many queries in one call, the same rows as
-- ORDER BY ... LIMIT scans on the CPU at the same ef_search, only rows the
-- caller sees, clear errors.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_graph;
RESET client_min_messages;
SET gpu_graph.search_device = cpu;
SET gpu_graph.iterative_scan = relaxed_order;

-- 5000 rows of 16 dimensions, spread (a deterministic mix of sines)
-- (room on each page for HOT updates)
CREATE TABLE bt (id int PRIMARY KEY, e real[], note text) WITH (fillfactor = 70);
INSERT INTO bt
SELECT i, ARRAY(SELECT (sin(i * 0.7311 + j * 1.913) * 10 + sin(i * (0.011 * j)) * 5)::real
                FROM generate_series(1, 16) j)
FROM generate_series(1, 5000) i;
CREATE INDEX bt_idx ON bt USING gpu_graph (e real_l2_ops) WITH (storage = 'f32');
-- 60 queries near rows but not on them
CREATE TABLE bq (qn int, v real[]);
INSERT INTO bq
SELECT n, ARRAY(SELECT (sin((n * 83) * 0.7311 + j * 1.913) * 10 + sin((n * 83) * (0.011 * j)) * 5 + 0.37 * sin(n + j))::real
                FROM generate_series(1, 16) j)
FROM generate_series(1, 60) n;
CREATE FUNCTION bq_matrix() RETURNS real[] LANGUAGE sql AS
  $$ SELECT array_agg(v ORDER BY qn) FROM bq $$;

-- the ORDER BY scans, through the index (rank = the order it gave)
CREATE FUNCTION scans(k int) RETURNS TABLE (query int, rank int, row_ctid tid) LANGUAGE sql STABLE AS $$
  SELECT bq.qn, s.rank::int, s.ctid FROM bq,
    LATERAL (SELECT row_number() OVER () AS rank, z.ctid
             FROM (SELECT bt.ctid FROM bt ORDER BY bt.e <-> bq.v LIMIT k) z) s
$$;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT * FROM scans(10);

-- the batch's rows equal the scans' at the same ef_search, query for query and rank for rank
SET gpu_graph.ef_search = 40;
-- (ctid names a system column: a table made of the rows renames it)
CREATE TEMP TABLE b40 AS SELECT query, rank, ctid AS row_ctid, distance FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10);
SELECT count(*) AS rows, count(DISTINCT query) AS queries, min(rank), max(rank) FROM b40;
SELECT count(*) AS differ FROM ((SELECT * FROM scans(10) EXCEPT SELECT query, rank, row_ctid FROM b40)
                                UNION ALL (SELECT query, rank, row_ctid FROM b40 EXCEPT SELECT * FROM scans(10))) d;
-- ef given as an argument is the setting's ef_search
SET gpu_graph.ef_search = 10;
SELECT count(*) AS differ FROM ((SELECT * FROM scans(10) EXCEPT SELECT query, rank, ctid FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10, 10))
                                UNION ALL (SELECT query, rank, ctid FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10, 10) EXCEPT SELECT * FROM scans(10))) d;
RESET gpu_graph.ef_search;

-- a batch of 600 (each query ten times) is searched on all cores from a
-- copy of the index: the same rows again
SELECT count(*) AS rows, count(s.query) AS equal_to_scans
  FROM gpu_graph_search_batch('bt_idx', (SELECT array_agg(v ORDER BY r, qn) FROM bq, generate_series(0, 9) r), 10) b
  LEFT JOIN b40 s ON s.query = (b.query - 1) % 60 + 1 AND s.rank = b.rank AND s.row_ctid = b.ctid;

-- the table form: every row of a table as a query. The query table's
-- rows give b40's rows; the whole-table self join (read in ranges of
-- blocks of about 500 rows) finds each row itself
SELECT count(*) AS rows, count(s.query) AS equal_to_batch
  FROM gpu_graph_knn_join('bt_idx', 'bq', 'v', 10, 40) j JOIN bq ON bq.ctid = j.query_ctid
  LEFT JOIN b40 s ON s.query = bq.qn AND s.rank = j.rank AND s.row_ctid = j.ctid;
ANALYZE bt;
SELECT count(*) AS rows, count(DISTINCT query_ctid) AS queries,
       count(*) FILTER (WHERE ctid = query_ctid) >= 0.95 * 5000 AS finds_itself_95pct
  FROM gpu_graph_knn_join('bt_idx', 'bt', 'e', 1, 40, 500);
-- the largest chunk: one range, the whole table (chunk * pages once
-- overflowed int4 on a 1M-row table)
SELECT count(*) AS rows, count(DISTINCT query_ctid) AS queries
  FROM gpu_graph_knn_join('bt_idx', 'bt', 'e', 1, 40, 2147483647);
SELECT count(*) FROM gpu_graph_knn_join('bt_idx', 'bt', 'e', 1, 40, 0);
SELECT count(*) FROM gpu_graph_knn_join('bt_idx', 'bt', 'nope', 1);

-- inner product (whose index pins outliers as extra starting points, the
-- copy too): the same rows serially and on all cores
CREATE INDEX bt_ip ON bt USING gpu_graph (e real_ip_ops);
CREATE TEMP TABLE ip_scans AS SELECT bq.qn AS query, s.rank::int, s.ctid AS row_ctid FROM bq,
  LATERAL (SELECT row_number() OVER () AS rank, z.ctid FROM (SELECT bt.ctid FROM bt ORDER BY bt.e <#> bq.v LIMIT 10) z) s;
SELECT count(*) AS rows, count(s.query) AS equal_to_scans
  FROM gpu_graph_search_batch('bt_ip', (SELECT array_agg(v ORDER BY r, qn) FROM bq, generate_series(0, 9) r), 10) b
  LEFT JOIN ip_scans s ON s.query = (b.query - 1) % 60 + 1 AND s.rank = b.rank AND s.row_ctid = b.ctid;
DROP INDEX bt_ip;

-- distances are the index's, from its stored vectors (f32 here: the
-- operator's), nearest first
SELECT count(*) AS wrong_distance FROM b40 JOIN bt ON bt.ctid = b40.row_ctid JOIN bq ON bq.qn = b40.query
 WHERE abs(b40.distance - (bt.e <-> bq.v)) > 1e-5 * greatest(1, bt.e <-> bq.v);
SELECT count(*) AS out_of_order FROM b40 a JOIN b40 b ON a.query = b.query AND b.rank = a.rank + 1
 WHERE b.distance < a.distance;

-- recall@10 against the exact neighbours (a sequential scan)
SET enable_seqscan = on;
SET enable_indexscan = off;
CREATE TEMP TABLE exact AS SELECT * FROM scans(10);
RESET enable_indexscan;
SET enable_seqscan = off;
SELECT count(*) >= 0.95 * 600 AS recall_at_least_095
  FROM exact JOIN b40 ON b40.query = exact.query AND b40.row_ctid = exact.row_ctid;

-- rows the caller does not see are never returned, and k rows still come
DELETE FROM bt WHERE id % 7 = 0;
CREATE TEMP TABLE after_delete AS SELECT query, rank, ctid AS row_ctid FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10);
SELECT count(*) AS rows, count(bt.id) AS joined, count(*) FILTER (WHERE bt.id % 7 = 0) AS deleted_returned
  FROM after_delete LEFT JOIN bt ON bt.ctid = after_delete.row_ctid;
-- an updated row comes back as its new version's ctid: a HOT update (the
-- index still points at the old version) and one that moves the row
UPDATE bt SET note = 'hot' WHERE id IN (SELECT bt.id FROM b40 JOIN bt ON bt.ctid = b40.row_ctid WHERE b40.rank = 1 AND b40.query <= 30);
UPDATE bt SET id = id + 100000 WHERE id IN (SELECT bt.id FROM b40 JOIN bt ON bt.ctid = b40.row_ctid WHERE b40.rank = 1 AND b40.query > 30);
SELECT count(*) AS rows, count(bt.id) AS joined,
       count(*) FILTER (WHERE bt.note = 'hot') AS hot_found, count(*) FILTER (WHERE bt.id > 100000) AS moved_found
  FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 1) r LEFT JOIN bt ON bt.ctid = r.ctid;
-- a row inserted in this transaction is seen by it, not by others
BEGIN;
INSERT INTO bt SELECT -1, v FROM bq WHERE qn = 3;
SELECT bt.id, r.distance FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 1) r JOIN bt ON bt.ctid = r.ctid WHERE r.query = 3;
ROLLBACK;
SELECT bt.id = -1 AS rolled_back_row_returned FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 1) r JOIN bt ON bt.ctid = r.ctid WHERE r.query = 3;

-- the copy a large batch searches is kept for its transaction only while
-- the index is unchanged: a row inserted after it is found by the next batch
BEGIN;
SELECT count(*) FROM gpu_graph_search_batch('bt_idx', (SELECT array_agg(v ORDER BY r, qn) FROM bq, generate_series(0, 9) r), 1);
INSERT INTO bt SELECT -2, v FROM bq WHERE qn = 5;
SELECT bt.id AS new_row_first FROM gpu_graph_search_batch('bt_idx', (SELECT array_agg(v ORDER BY r, qn) FROM bq, generate_series(0, 9) r), 1) r
  JOIN bt ON bt.ctid = r.ctid WHERE r.query IN (5, 65, 545) ORDER BY r.query;
ROLLBACK;

-- iterative_scan: off stops after one round of ef_search rows, as a scan does
SET gpu_graph.iterative_scan = off;
SELECT count(*) AS rows_off FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 20, 5);
SET gpu_graph.iterative_scan = relaxed_order;
SELECT count(*) AS rows_relaxed FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 20, 5);

-- a long batch stops at a cancel (here statement_timeout) between queries
CREATE TEMP TABLE bigq AS SELECT array_agg(v) AS m FROM (SELECT v FROM bq, generate_series(1, 1000)) s;
SET statement_timeout = '200ms';
SELECT count(*) FROM gpu_graph_search_batch('bt_idx', (SELECT m FROM bigq), 10);
RESET statement_timeout;

-- nothing to search: no rows
SELECT count(*) FROM gpu_graph_search_batch('bt_idx', '{}'::real[], 10);
SELECT count(*) FROM gpu_graph_search_batch('bt_idx', NULL, 10);
SELECT count(*) FROM gpu_graph_search_batch('bt_idx', bq_matrix(), NULL);
CREATE TABLE bempty (e real[]);
CREATE INDEX bempty_idx ON bempty USING gpu_graph (e);
SELECT count(*) FROM gpu_graph_search_batch('bempty_idx', ARRAY[[1,2]]::real[], 10);

-- bad input
SELECT * FROM gpu_graph_search_batch('bt_idx', ARRAY[1,2,3]::real[], 10);
SELECT * FROM gpu_graph_search_batch('bt_idx', ARRAY[[[1]]]::real[], 10);
SELECT * FROM gpu_graph_search_batch('bt_idx', ARRAY[[1,2,3]]::real[], 10);
SELECT * FROM gpu_graph_search_batch('bt_idx', ARRAY[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,NULL]]::real[], 10);
SELECT * FROM gpu_graph_search_batch('bt_idx', ARRAY[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,'Infinity']]::real[], 10);
SELECT * FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 0);
SELECT * FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 1001);
SELECT * FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10, 0);
SELECT * FROM gpu_graph_search_batch('bt_pkey', bq_matrix(), 10);
SELECT * FROM gpu_graph_search_batch('bt', bq_matrix(), 10);
-- a partitioned table's index has no pages: its partitions' indexes do
CREATE TABLE bpart (id int, e real[]) PARTITION BY RANGE (id);
CREATE TABLE bpart1 PARTITION OF bpart FOR VALUES FROM (0) TO (100);
INSERT INTO bpart SELECT i, ARRAY[i, 1]::real[] FROM generate_series(0, 99) i;
CREATE INDEX bpart_idx ON bpart USING gpu_graph (e);
SELECT * FROM gpu_graph_search_batch('bpart_idx', ARRAY[[1,2]]::real[], 3);
SELECT count(*) FROM gpu_graph_search_batch('bpart1_e_idx', ARRAY[[1,2]]::real[], 3);
DROP TABLE bpart;
-- the table's SELECT privilege is needed
CREATE ROLE regress_batch_reader;
GRANT SELECT ON bq TO regress_batch_reader;
SET ROLE regress_batch_reader;
SELECT * FROM gpu_graph_search_batch('bt_idx', bq_matrix(), 10);
RESET ROLE;
REVOKE SELECT ON bq FROM regress_batch_reader;
DROP ROLE regress_batch_reader;

DROP TABLE bt, bq, bempty;
DROP FUNCTION bq_matrix(), scans(int);
