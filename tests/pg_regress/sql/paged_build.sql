-- CREATE INDEX beyond maintenance_work_mem (the sharded-build issue, part
-- 5): the vectors go to their pages as the heap is read, the graph is built
-- in shards read back from those pages, each shard's lists wait in
-- temporary files, and the merge writes the graph pages. The host never
-- holds every vector; the index answers as one built in memory.
SET client_min_messages = warning;
SET gpu_graph.build_device = cpu;

-- 40,000 rows of 32 dimensions (5 MB of f32) on a 3-dimensional manifold
CREATE TABLE paged (id int, v real[]);
SELECT setseed(0.5);
INSERT INTO paged
SELECT i, (SELECT array_agg((a * cos(j) + b * sin(j * 1.3) + c * cos(j * 0.7))::real ORDER BY j)
             FROM generate_series(1, 32) j)
  FROM (SELECT i, random() * 10 AS a, random() * 10 AS b, random() * 10 AS c
          FROM generate_series(1, 40000) i) p;

-- 1 MB is too small even for shards of 1,000 rows: an ERROR
-- that says how much would
SET maintenance_work_mem = '1MB';
CREATE INDEX paged_idx ON paged USING gpu_graph (v);

-- 3 MB: built from the pages in shards (a CPU build shards only then);
-- f32 pages, so that each row's own vector is at distance 0 from it
SET maintenance_work_mem = '3MB';
CREATE INDEX paged_idx ON paged USING gpu_graph (v) WITH (storage = 'f32');
RESET maintenance_work_mem;
SELECT (gpu_graph_info('paged_idx')->'build'->'shards'->>'count')::int > 2 AS sharded,
       gpu_graph_info('paged_idx')->'build'->'shards'->'overlap' AS overlap,
       gpu_graph_info('paged_idx')->'build'->'rows' AS rows,
       gpu_graph_info('paged_idx')->'nodes' AS nodes;
SELECT gpu_graph_verify('paged_idx');

-- recall@10 of 50 rows' own vectors against the exact answer, and each
-- row found first by its own vector (48 of 50 at ef_search 40 with shards
-- this small, 1,575 rows: the same table built in memory finds 50)
SET enable_seqscan = off;
SET gpu_graph.ef_search = 40;
CREATE TABLE probes AS SELECT id, v FROM paged WHERE id % 800 = 0;
CREATE TABLE truth AS
  SELECT p.id AS probe, t.id FROM probes p,
    LATERAL (SELECT id FROM paged ORDER BY (SELECT sum((x - y) ^ 2) FROM unnest(p.v, paged.v) u(x, y)) LIMIT 10) t;
SELECT count(*) >= 480 AS recall_at_least_0_96 FROM probes p,
  LATERAL (SELECT id FROM paged ORDER BY v <-> p.v LIMIT 10) f
  WHERE f.id IN (SELECT id FROM truth WHERE probe = p.id);
SELECT count(*) >= 47 AS found_self FROM probes p
  WHERE p.id = (SELECT id FROM paged ORDER BY v <-> p.v LIMIT 1);

-- the index stays writable: an insert is found at once
INSERT INTO paged VALUES (40001, array_fill(1000::real, ARRAY[32]));
SELECT id FROM paged ORDER BY v <-> array_fill(1000::real, ARRAY[32]) LIMIT 1;
DROP TABLE paged, probes, truth;
