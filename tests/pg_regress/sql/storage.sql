-- storage = 'f16' (the default): vector pages of IEEE half (the graph is
-- built on the f32 input; scans rank by the stored values). Two thirds of the pages here (the
-- vector pages halve), recall as good as f32's, inserts stored and found.
SET client_min_messages = warning;
CREATE TABLE st (id int, v real[]);
SELECT setseed(0.25);
INSERT INTO st SELECT i, ARRAY(SELECT random()::real FROM generate_series(1, 64) j WHERE i > 0)
  FROM generate_series(1, 20000) i;
CREATE TABLE st_q AS SELECT q, ARRAY(SELECT random()::real FROM generate_series(1, 64) j WHERE q > 0) AS v
  FROM generate_series(1, 20) q;
CREATE FUNCTION st_knn(query real[]) RETURNS int[] LANGUAGE sql AS
  $$ SELECT array_agg(id ORDER BY id) FROM (SELECT id FROM st ORDER BY v <-> query LIMIT 10) s $$;
CREATE FUNCTION st_recall(answers regclass) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE r numeric;
BEGIN
  EXECUTE format('SELECT sum((SELECT count(*) FROM unnest(a.ids) x WHERE x = ANY (e.ids))) / 200.0
                    FROM %s a JOIN exact e USING (q)', answers) INTO r;
  RETURN r;
END $$;
SET enable_indexscan = off;
CREATE TEMP TABLE exact AS SELECT q, st_knn(v) AS ids FROM st_q;
RESET enable_indexscan;

-- recall@10 over 20 queries through each index at equal ef_search (uniform
-- random 64-dim vectors are hard: f32 itself is near 0.92 at ef 200)
SET gpu_graph.ef_search = 200;
SET enable_seqscan = off;
CREATE INDEX st_f32 ON st USING gpu_graph (v) WITH (storage = 'f32');
CREATE TEMP TABLE via_f32 AS SELECT q, st_knn(v) AS ids FROM st_q;
CREATE TEMP TABLE f32_size AS SELECT pg_relation_size('st_f32') AS bytes;
DROP INDEX st_f32;
-- f16 is the default
CREATE INDEX st_f16 ON st USING gpu_graph (v);
CREATE TEMP TABLE via_f16 AS SELECT q, st_knn(v) AS ids FROM st_q;
SET gpu_graph.ef_search = 800;
CREATE TEMP TABLE via_f16_800 AS SELECT q, st_knn(v) AS ids FROM st_q;
RESET enable_seqscan;
SELECT gpu_graph_info('st_f16')->'storage' AS storage, gpu_graph_info('st_f16')->'nodes'->'live' AS live;
-- 64 dims: 264 bytes a tuple in f32 (60 nodes in a graph page and 2 vector
-- pages), 136 in f16 (60 in a graph page and 1 vector page)
SELECT round(pg_relation_size('st_f16')::numeric / bytes, 2) AS f16_to_f32 FROM f32_size;
SELECT st_recall('via_f16') >= st_recall('via_f32') - 0.02 AS f16_within_002_of_f32,
       st_recall('via_f32') >= 0.85 AS f32_at_least_085,
       st_recall('via_f16_800') >= 0.99 AS f16_ef800_at_least_099;

-- an inserted row is stored in f16 and found
INSERT INTO st SELECT 20001, array_fill(3.0::real, ARRAY[64]);
SET enable_seqscan = off;
SELECT id FROM st ORDER BY v <-> array_fill(2.9::real, ARRAY[64]) LIMIT 1;
RESET enable_seqscan;
DROP TABLE st, st_q;
DROP FUNCTION st_knn, st_recall;
