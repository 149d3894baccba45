-- Where no GPU is usable (CI has no NVIDIA driver), build_device = auto falls
-- back to the CPU with a WARNING that says why, and build_device = gpu is an
-- ERROR that leaves nothing behind. (Run on a machine without a GPU.)
CREATE TABLE fallback (id int, v real[]);
INSERT INTO fallback SELECT i, ARRAY[i % 10, i / 10]::real[] FROM generate_series(0, 99) i;
SET client_min_messages = warning;
SET gpu_graph.build_device = auto;
CREATE INDEX fallback_auto ON fallback USING gpu_graph (v) WITH (knn = 'exact');
SELECT gpu_graph_info('fallback_auto')->'build'->>'device' AS device;
SET enable_seqscan = off;
SELECT id FROM fallback ORDER BY v <-> '{3.1,4.2}' LIMIT 3;
RESET enable_seqscan;
SET gpu_graph.build_device = gpu;
CREATE INDEX fallback_gpu ON fallback USING gpu_graph (v);
SELECT count(*) AS indexes FROM pg_indexes WHERE tablename = 'fallback';
-- cpu never tries a GPU: no WARNING
SET gpu_graph.build_device = cpu;
CREATE INDEX fallback_cpu ON fallback USING gpu_graph (v);
CREATE INDEX fallback_descent ON fallback USING gpu_graph (v) WITH (knn = 'gnn_descent');
SHOW gpu_graph.build_device;
SET gpu_graph.build_device = sometimes;
CREATE INDEX ON fallback USING gpu_graph (v) WITH (knn = 'bogus');
DROP TABLE fallback;
