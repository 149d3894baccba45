-- Bad input at CREATE INDEX and INSERT: a clear ERROR, nothing half-built,
-- nothing corrupted.
SET client_min_messages = warning;

CREATE TABLE dims (id int, v real[]);
INSERT INTO dims VALUES (1, '{1,2,3}'), (2, '{4,5,6}'), (3, '{7,8}');
CREATE INDEX dims_idx ON dims USING gpu_graph (v);
SELECT count(*) AS indexes_left FROM pg_indexes WHERE tablename = 'dims';

CREATE TABLE nonfinite (id int, v real[]);
INSERT INTO nonfinite VALUES (1, '{1,2}'), (2, '{NaN,1}');
CREATE INDEX ON nonfinite USING gpu_graph (v);
UPDATE nonfinite SET v = '{Infinity,1}' WHERE id = 2;
CREATE INDEX ON nonfinite USING gpu_graph (v);
UPDATE nonfinite SET v = '{-Infinity,1}' WHERE id = 2;
CREATE INDEX ON nonfinite USING gpu_graph (v);

CREATE TABLE zero_dims (v real[]);
INSERT INTO zero_dims VALUES ('{}');
CREATE INDEX ON zero_dims USING gpu_graph (v);

CREATE TABLE too_many (v real[]);
INSERT INTO too_many SELECT array_agg(1::real) FROM generate_series(1, 2001);
CREATE INDEX ON too_many USING gpu_graph (v) WITH (storage = 'f32');
-- f16 storage (the default) takes up to 4000
CREATE INDEX too_many_idx ON too_many USING gpu_graph (v);
SELECT gpu_graph_info('too_many_idx')->'dimensions' AS dims, gpu_graph_info('too_many_idx')->'storage' AS storage;
DROP INDEX too_many_idx;
CREATE TABLE too_wide (v real[]);
INSERT INTO too_wide SELECT array_agg(1::real) FROM generate_series(1, 4001);
CREATE INDEX ON too_wide USING gpu_graph (v);
-- an empty f32 index takes its dimensions from the first row, within its limit
CREATE TABLE too_many_later (v real[]);
CREATE INDEX ON too_many_later USING gpu_graph (v) WITH (storage = 'f32');
INSERT INTO too_many_later SELECT v FROM too_many;
-- 2000 is the f32 limit, and allowed
UPDATE too_many SET v = v[1:2000];
CREATE INDEX too_many_idx ON too_many USING gpu_graph (v) WITH (storage = 'f32');
SELECT gpu_graph_info('too_many_idx')->'dimensions' AS dims;
DROP INDEX too_many_idx;
-- storage takes f32 or f16
CREATE INDEX ON too_many USING gpu_graph (v) WITH (storage = 'f8');

CREATE TABLE elem_null (v real[]);
INSERT INTO elem_null VALUES ('{1,NULL}');
CREATE INDEX ON elem_null USING gpu_graph (v);

CREATE TABLE multi (v real[]);
INSERT INTO multi VALUES ('{{1,2},{3,4}}');
CREATE INDEX ON multi USING gpu_graph (v);

-- options out of range, unknown, or inconsistent
CREATE TABLE opts (v real[]);
CREATE INDEX ON opts USING gpu_graph (v) WITH (degree = 7);
CREATE INDEX ON opts USING gpu_graph (v) WITH (degree = 129);
CREATE INDEX ON opts USING gpu_graph (v) WITH (s = 0);
CREATE INDEX ON opts USING gpu_graph (v) WITH (t1 = 0);
CREATE INDEX ON opts USING gpu_graph (v) WITH (t2 = 65);
CREATE INDEX ON opts USING gpu_graph (v) WITH (r = 4);
CREATE INDEX ON opts USING gpu_graph (v) WITH (rho = 1.5);
CREATE INDEX ON opts USING gpu_graph (v) WITH (degree = 64, r = 32);
CREATE INDEX ON opts USING gpu_graph (v) WITH (algorithm = 'hnsw');
CREATE INDEX ON opts USING gpu_graph (v) WITH (ef = 10);
CREATE INDEX ON opts USING gpu_graph (v) WITH (knn = 'nearest');
CREATE INDEX opts_ok ON opts USING gpu_graph (v) WITH (algorithm = 'rnn_descent', degree = 16, s = 8, r = 32, t1 = 2, t2 = 4, rho = 0.5, knn = 'random');
SELECT reloptions FROM pg_class WHERE relname = 'opts_ok';
-- a multi-column index is not supported
CREATE INDEX ON opts USING gpu_graph (v, v);

-- an index on an empty table takes its dimensions from the first insert,
-- and then holds every later row to them
CREATE TABLE later (id int, v real[]);
CREATE INDEX later_idx ON later USING gpu_graph (v);
INSERT INTO later VALUES (1, '{1,1,1}');
INSERT INTO later VALUES (2, '{1,1}');
INSERT INTO later VALUES (3, '{NaN,1,1}');
INSERT INTO later VALUES (4, NULL);
INSERT INTO later VALUES (5, '{2,2,2}');
SELECT id FROM later ORDER BY v <-> '{2,2,2}' LIMIT 5;
-- a query vector of the wrong dimension
SET enable_seqscan = off;
SELECT id FROM later ORDER BY v <-> '{2,2}' LIMIT 5;
SELECT id FROM later ORDER BY v <-> '{NaN,2,2}' LIMIT 5;
RESET enable_seqscan;

-- cosine: zero vectors are not indexed (they have no direction); the rest are
CREATE TABLE cos (id int, v real[]);
INSERT INTO cos VALUES (1, '{0,0}'), (2, '{1,0}'), (3, '{0,1}'), (4, '{1,1}');
CREATE INDEX cos_idx ON cos USING gpu_graph (v real_cosine_ops);
INSERT INTO cos VALUES (5, '{0,0}'), (6, '{2,1}');
SET enable_seqscan = off;
SELECT id FROM cos ORDER BY v <=> '{1,0}' LIMIT 10;
RESET enable_seqscan;
SELECT gpu_graph_info('cos_idx')->'nodes' AS nodes;

-- not enough maintenance_work_mem: an ERROR that says how much is needed
CREATE TABLE big (v real[]);
INSERT INTO big SELECT array_agg(random()::real) FROM generate_series(1, 2000 * 600) g GROUP BY g % 600;
SET maintenance_work_mem = '1MB';
CREATE INDEX ON big USING gpu_graph (v);
RESET maintenance_work_mem;

-- gpu_graph_info on something else
SELECT gpu_graph_info('big');

DROP TABLE dims, nonfinite, zero_dims, too_many, too_wide, too_many_later, elem_null, multi, opts, later, cos, big;
