"""gpu_graph through the clients people already have: psycopg 3 and the
pgvector package register the `vector` type, COPY the minilm384 rows in
(binary), create the index with one line, and run the query pgvector's
documentation gives, ORDER BY embedding <=> %s LIMIT 10; recall@10 against
the data set's exact ground truth must be at least 0.95, and the plan must
use the index (the planner picks it unaided on the full set's 61,666 rows).

    python pgvector_client.py DATA_DIR      (PGHOST etc. name the server)
"""

import struct
import sys

import numpy as np
import psycopg
from pgvector.psycopg import register_vector


def fvecs(path):
    raw = open(path, "rb").read()
    d = struct.unpack_from("<i", raw)[0]
    return np.frombuffer(raw, dtype=np.float32).reshape(-1, d + 1)[:, 1:]


def ivecs(path):
    raw = open(path, "rb").read()
    k = struct.unpack_from("<i", raw)[0]
    return np.frombuffer(raw, dtype=np.int32).reshape(-1, k + 1)[:, 1:]


data = sys.argv[1]
base = fvecs(f"{data}/minilm384_base.fvecs")
queries = fvecs(f"{data}/minilm384_query.fvecs")[:100]
truth = ivecs(f"{data}/minilm384_groundtruth.ivecs")[:100, :10]

conn = psycopg.connect(autocommit=True)
conn.execute("SET client_min_messages = warning")
for ext in ("vector", "gpu_graph", "gpu_graph_pgvector"):
    conn.execute(f"CREATE EXTENSION IF NOT EXISTS {ext}")
register_vector(conn)
conn.execute("DROP TABLE IF EXISTS docs")
conn.execute(f"CREATE TABLE docs (id int, embedding vector({base.shape[1]}))")
with conn.cursor().copy("COPY docs (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
    copy.set_types(["int4", "vector"])
    for i, v in enumerate(base):
        copy.write_row([i, v])
conn.execute("CREATE INDEX docs_embedding ON docs USING gpu_graph (embedding vector_cosine_ops)")
conn.execute("ANALYZE docs")
if len(base) < 10000:
    # the repository's sample (900 rows): a sequential scan is cheaper there
    conn.execute("SET enable_seqscan = off")

plan = "\n".join(r[0] for r in conn.execute(
    "EXPLAIN (COSTS OFF) SELECT id FROM docs ORDER BY embedding <=> %s LIMIT 10", (queries[0],)))
assert "Index Scan using docs_embedding" in plan, plan

hits = 0
for q, t in zip(queries, truth):
    ids = [r[0] for r in conn.execute("SELECT id FROM docs ORDER BY embedding <=> %s LIMIT 10", (q,))]
    hits += len(set(ids) & set(t.tolist()))
recall = hits / (10 * len(queries))
print(f"  psycopg {psycopg.__version__}, pgvector-python: {len(base)} rows copied in, "
      f"recall@10 {recall:.4f} over {len(queries)} queries (default ef_search)")
if recall < 0.95:
    sys.exit(f"pgvector_client: FAIL: recall@10 {recall:.4f} below 0.95")
