-- gpu_graph indexes on pgvector's vector and halfvec columns, bound to
-- pgvector's own operators and distance functions: ORDER BY embedding <->
-- (or <=>, <#>) $1 LIMIT k uses the index, and its distances are pgvector's.
\echo Use "CREATE EXTENSION gpu_graph_pgvector" to load this file. \quit

CREATE OPERATOR CLASS vector_l2_ops FOR TYPE vector USING gpu_graph AS
    OPERATOR 1 <-> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 l2_distance(vector, vector);
CREATE OPERATOR CLASS vector_cosine_ops FOR TYPE vector USING gpu_graph AS
    OPERATOR 1 <=> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 cosine_distance(vector, vector);
CREATE OPERATOR CLASS vector_ip_ops FOR TYPE vector USING gpu_graph AS
    OPERATOR 1 <#> (vector, vector) FOR ORDER BY float_ops,
    FUNCTION 1 vector_negative_inner_product(vector, vector);

CREATE OPERATOR CLASS halfvec_l2_ops FOR TYPE halfvec USING gpu_graph AS
    OPERATOR 1 <-> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 l2_distance(halfvec, halfvec);
CREATE OPERATOR CLASS halfvec_cosine_ops FOR TYPE halfvec USING gpu_graph AS
    OPERATOR 1 <=> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 cosine_distance(halfvec, halfvec);
CREATE OPERATOR CLASS halfvec_ip_ops FOR TYPE halfvec USING gpu_graph AS
    OPERATOR 1 <#> (halfvec, halfvec) FOR ORDER BY float_ops,
    FUNCTION 1 halfvec_negative_inner_product(halfvec, halfvec);

-- gpu_graph_search_batch with the queries as an array of pgvector values:
-- each element a query, in order (pgvector's casts to real[]; the index's
-- own function does the rest)
CREATE FUNCTION gpu_graph_search_batch(index regclass, queries vector[], k int, ef int DEFAULT NULL)
    RETURNS TABLE (query int, rank int, ctid tid, distance real)
    LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT * FROM gpu_graph_search_batch($1,
        (SELECT array_agg(q::real[] ORDER BY n) FROM unnest($2) WITH ORDINALITY AS u(q, n)), $3, $4)
$$;
CREATE FUNCTION gpu_graph_search_batch(index regclass, queries halfvec[], k int, ef int DEFAULT NULL)
    RETURNS TABLE (query int, rank int, ctid tid, distance real)
    LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT * FROM gpu_graph_search_batch($1,
        (SELECT array_agg(q::real[] ORDER BY n) FROM unnest($2) WITH ORDINALITY AS u(q, n)), $3, $4)
$$;
