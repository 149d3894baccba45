-- algorithm = 'nsg' | 'vamana' | 'cagra' | 'tsdg': the CFS graphs (built on
-- the CPU from RNN-Descent's), their options checked at CREATE INDEX, shown
-- by gpu_graph_info, and recall@10 against the exact neighbours.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_graph;
RESET client_min_messages;
SET gpu_graph.build_device = cpu;
SET gpu_graph.search_device = cpu;
CREATE TABLE alg (id int, e real[]);
INSERT INTO alg
SELECT i, ARRAY(SELECT (sin(i * 0.7311 + j * 1.913) * 10 + sin(i * (0.011 * j)) * 5)::real
                FROM generate_series(1, 16) j)
FROM generate_series(1, 4000) i;
CREATE TABLE algq AS
SELECT n, ARRAY(SELECT (sin((n * 83) * 0.7311 + j * 1.913) * 10 + sin((n * 83) * (0.011 * j)) * 5 + 0.37 * sin(n + j))::real
                FROM generate_series(1, 16) j) AS v
FROM generate_series(1, 50) n;
-- the exact 10 nearest of each query
CREATE TABLE alg_exact AS
SELECT algq.n, x.id FROM algq, LATERAL (SELECT id FROM alg ORDER BY e <-> algq.v LIMIT 10) x;

-- recall@10 of the index the planner takes, at ef_search 40
CREATE FUNCTION alg_recall() RETURNS numeric LANGUAGE sql AS $$
  SELECT round(count(*) / 500.0, 2) FROM algq,
    LATERAL (SELECT id FROM alg ORDER BY e <-> algq.v LIMIT 10) x
  WHERE (algq.n, x.id) IN (SELECT n, id FROM alg_exact)
$$;
SET enable_seqscan = off;
SET gpu_graph.ef_search = 40;

CREATE INDEX alg_idx ON alg USING gpu_graph (e) WITH (algorithm = 'nsg');
SELECT gpu_graph_info('alg_idx') ->> 'algorithm' AS algorithm, gpu_graph_info('alg_idx') -> 'parameters' -> 'candidates' AS candidates,
       (gpu_graph_info('alg_idx') #>> '{nodes,live}')::int AS live, alg_recall() >= 0.95 AS recall_at_least_095;
DROP INDEX alg_idx;
CREATE INDEX alg_idx ON alg USING gpu_graph (e) WITH (algorithm = 'vamana', alpha = 1.3);
SELECT gpu_graph_info('alg_idx') ->> 'algorithm' AS algorithm, gpu_graph_info('alg_idx') #> '{parameters,alpha}' AS alpha,
       alg_recall() >= 0.95 AS recall_at_least_095;
DROP INDEX alg_idx;
CREATE INDEX alg_idx ON alg USING gpu_graph (e) WITH (algorithm = 'cagra', candidates = 48);
SELECT gpu_graph_info('alg_idx') ->> 'algorithm' AS algorithm, gpu_graph_info('alg_idx') #> '{parameters,candidates}' AS candidates,
       alg_recall() >= 0.95 AS recall_at_least_095;
DROP INDEX alg_idx;
CREATE INDEX alg_idx ON alg USING gpu_graph (e) WITH (algorithm = 'tsdg', lambda = 8);
SELECT gpu_graph_info('alg_idx') ->> 'algorithm' AS algorithm, gpu_graph_info('alg_idx') #> '{parameters,lambda}' AS lambda,
       gpu_graph_info('alg_idx') #> '{parameters,alpha}' AS alpha, alg_recall() >= 0.95 AS recall_at_least_095;
-- every node reachable, every list sound (gpu_graph_verify: no rows)
SELECT count(*) AS problems FROM gpu_graph_verify('alg_idx');
-- inserts and VACUUM keep working on it
INSERT INTO alg SELECT -n, v FROM algq;
SELECT count(*) AS found_self FROM algq
 WHERE (SELECT id FROM alg ORDER BY e <-> algq.v LIMIT 1) = -n;
DELETE FROM alg WHERE id < 0;
VACUUM alg;
SELECT count(*) AS problems FROM gpu_graph_verify('alg_idx');
SELECT alg_recall() >= 0.95 AS recall_at_least_095;
-- batches search a prefix of each list of a tsdg index (TSDG orders lists
-- so that one is a good smaller list): half of it by default; whole lists
-- (gpu_graph.batch_prefix at the degree or above) give the scans' rows,
-- two entries a list show the prefix is what is searched (one would not:
-- a search that runs out of graph goes on over every node)
CREATE FUNCTION alg_batch_recall() RETURNS numeric LANGUAGE sql AS $$
  SELECT round(count(*) / 500.0, 2)
    FROM gpu_graph_search_batch('alg_idx', (SELECT array_agg(v ORDER BY n) FROM algq), 10, 40) b
    JOIN alg ON alg.ctid = b.ctid
   WHERE (b.query, alg.id) IN (SELECT n, id FROM alg_exact)
$$;
SELECT alg_batch_recall() >= 0.90 AS half_lists_recall_at_least_090;
SET gpu_graph.batch_prefix = 256;
SELECT alg_batch_recall() = alg_recall() AS whole_lists_recall_as_scans;
SET gpu_graph.batch_prefix = 2;
SELECT alg_batch_recall() < 0.5 AS two_entries_a_list_find_less;
RESET gpu_graph.batch_prefix;
DROP FUNCTION alg_batch_recall();
DROP INDEX alg_idx;
-- inner product (pinned outliers, augmented vectors) and cosine: the
-- same floor against their own exact neighbours
CREATE FUNCTION alg_recall_op(op text) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE hits int;
BEGIN
  SET LOCAL enable_seqscan = on; SET LOCAL enable_indexscan = off;
  EXECUTE format('CREATE TEMP TABLE ex AS SELECT algq.n, x.id FROM algq,
                  LATERAL (SELECT id FROM alg ORDER BY e %s algq.v LIMIT 10) x', op);
  SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = on;
  EXECUTE format('SELECT count(*) FROM algq, LATERAL (SELECT id FROM alg ORDER BY e %s algq.v LIMIT 10) x
                  WHERE (algq.n, x.id) IN (SELECT n, id FROM ex)', op) INTO hits;
  DROP TABLE ex;
  RETURN round(hits / 500.0, 2);
END $$;
CREATE INDEX alg_ip ON alg USING gpu_graph (e real_ip_ops) WITH (algorithm = 'cagra');
SELECT alg_recall_op('<#>') >= 0.95 AS ip_recall_at_least_095;
DROP INDEX alg_ip;
CREATE INDEX alg_cos ON alg USING gpu_graph (e real_cosine_ops) WITH (algorithm = 'nsg');
SELECT alg_recall_op('<=>') >= 0.95 AS cosine_recall_at_least_095;
DROP INDEX alg_cos;
DROP FUNCTION alg_recall_op(text);

-- rnn_descent stays the default, with no CFS parameters shown
CREATE INDEX alg_idx ON alg USING gpu_graph (e);
SELECT gpu_graph_info('alg_idx') ->> 'algorithm' AS algorithm, gpu_graph_info('alg_idx') -> 'parameters' ? 'alpha' AS has_alpha;
DROP INDEX alg_idx;

-- bad options: clear ERRORs at CREATE INDEX
CREATE INDEX ON alg USING gpu_graph (e) WITH (algorithm = 'hnsw');
CREATE INDEX ON alg USING gpu_graph (e) WITH (algorithm = 'vamana', alpha = 0.9);
CREATE INDEX ON alg USING gpu_graph (e) WITH (algorithm = 'vamana', alpha = 2.5);
CREATE INDEX ON alg USING gpu_graph (e) WITH (algorithm = 'nsg', candidates = 16);
CREATE INDEX ON alg USING gpu_graph (e) WITH (algorithm = 'tsdg', lambda = -1);

DROP TABLE alg, algq, alg_exact;
DROP FUNCTION alg_recall();
