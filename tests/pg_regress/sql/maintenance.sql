-- Keeping the index true: INSERT after build, DELETE + VACUUM, REINDEX,
-- TRUNCATE, UPDATE, unlogged tables.
SET client_min_messages = warning;

CREATE TABLE items (id int, v real[]);
INSERT INTO items SELECT i, ARRAY[(i / 50)::real, (i % 50)::real, ((i * 7) % 11)::real] FROM generate_series(0, 2499) i;
CREATE INDEX items_idx ON items USING gpu_graph (v) WITH (degree = 16);
SET enable_seqscan = off;

-- rows inserted after the build are found at once by a search for themselves
INSERT INTO items SELECT i, ARRAY[(i / 50)::real + 0.5, (i % 50)::real + 0.5, 100::real] FROM generate_series(2500, 2999) i;
-- (the graph is built by parallel threads, so counts are floors, not exact)
SELECT count(*) >= 495 AS found_self_500 FROM items o
 WHERE o.id >= 2500 AND o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1);

-- deleted rows are never returned, before and after VACUUM
DELETE FROM items WHERE id % 5 = 0;
SELECT count(*) AS deleted_rows_returned FROM (
  SELECT id FROM items ORDER BY v <-> '{25,25,5}' LIMIT 3000) s WHERE id % 5 = 0;
VACUUM items;
SELECT count(*) AS rows_after_vacuum, count(*) FILTER (WHERE id % 5 = 0) AS deleted_rows_returned FROM (
  SELECT id FROM items ORDER BY v <-> '{25,25,5}' LIMIT 3000) s;
SELECT (gpu_graph_info('items_idx')->'nodes'->>'live')::int AS live_nodes,
       (gpu_graph_info('items_idx')->'nodes'->>'deleted')::int AS deleted_nodes;
-- the nearest neighbours of surviving rows are still found
SELECT count(*) >= 2352 AS found_self_98pct FROM items o
 WHERE o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1);
SELECT count(*) AS live_rows FROM items;

-- freed slots are reused by later inserts: the index does not grow
SELECT pg_relation_size('items_idx') AS size_before \gset
INSERT INTO items SELECT i, ARRAY[(i % 50)::real, (i / 50 % 50)::real, 3.5::real] FROM generate_series(3000, 3399) i;
SELECT pg_relation_size('items_idx') = :size_before AS same_size;
SELECT count(*) >= 396 AS found_self_400 FROM items o
 WHERE o.id >= 3000 AND o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1);

-- UPDATE moves a row: the old version's node is dead, the new one found
UPDATE items SET v = '{1000,1000,1000}' WHERE id = 1;
SELECT id FROM items ORDER BY v <-> '{1000,1000,1000}' LIMIT 1;

-- REINDEX rebuilds from the heap
REINDEX INDEX items_idx;
SELECT count(*) >= 2772 AS found_self_99pct FROM items o
 WHERE o.id = (SELECT id FROM items ORDER BY v <-> o.v LIMIT 1);
SELECT (gpu_graph_info('items_idx')->'nodes'->>'deleted')::int AS deleted_nodes;

-- TRUNCATE leaves an empty index that inserts fill again
TRUNCATE items;
SELECT id FROM items ORDER BY v <-> '{1,1,1}' LIMIT 1;
INSERT INTO items VALUES (7, '{1,1,1}'), (8, '{2,2,2}');
SELECT id FROM items ORDER BY v <-> '{2,2,1.9}' LIMIT 2;

-- unlogged tables get an init fork
CREATE UNLOGGED TABLE scratch (id int, v real[]);
CREATE INDEX ON scratch USING gpu_graph (v);
INSERT INTO scratch VALUES (1, '{1}'), (2, '{2}');
SELECT id FROM scratch ORDER BY v <-> '{1.9}' LIMIT 1;
RESET enable_seqscan;

DROP TABLE items, scratch;
