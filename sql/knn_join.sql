-- gpu_graph_knn_join(index, queries, column, k, ef, chunk): every row of the
-- table `queries` as a query (its `column`: real[], or a type with a cast to
-- real[] such as pgvector's), with its k nearest rows of the index's table
-- that the caller sees, as (query_ctid, rank, ctid, distance); the
-- whole-table self join is gpu_graph_knn_join(index, table, column, k).
-- The query table is read a range of blocks at a time (a TID range scan of
-- about `chunk` rows by its statistics); each range is one
-- gpu_graph_search_batch, whose rows go into the function's result store
-- (on disk past work_mem): memory stays bounded by the chunk, not the
-- table. STABLE: every range is read with the calling statement's snapshot.
-- Rows whose column is NULL ask nothing.
CREATE FUNCTION gpu_graph_knn_join(index regclass, queries regclass, "column" name, k int,
                                   ef int DEFAULT NULL, chunk int DEFAULT 100000)
    RETURNS TABLE (query_ctid tid, rank int, ctid tid, distance real)
    LANGUAGE plpgsql STABLE PARALLEL RESTRICTED AS $$
DECLARE
    pages bigint;
    step bigint;
    lo bigint := 0;
BEGIN
    IF index IS NULL OR queries IS NULL OR "column" IS NULL OR k IS NULL THEN
        RETURN;
    END IF;
    IF chunk IS NULL OR chunk < 1 THEN
        RAISE EXCEPTION 'gpu_graph_knn_join: chunk must be at least 1, not %', coalesce(chunk::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = queries AND a.attname = "column"
                                                AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'gpu_graph_knn_join: table % has no column %', queries, quote_ident("column")
            USING ERRCODE = 'undefined_column';
    END IF;
    pages := pg_relation_size(queries) / current_setting('block_size')::bigint;
    -- blocks per range: about `chunk` rows by the table's statistics, else
    -- 64, at most the table (in float8: chunk * relpages passes int4's range
    -- on a table of 1M rows)
    SELECT greatest(1, least(greatest(pages, 1),
                             CASE WHEN c.reltuples > 0 AND c.relpages > 0
                                  THEN floor(chunk::float8 * c.relpages / c.reltuples) ELSE 64 END))::bigint
      INTO step FROM pg_class c WHERE c.oid = queries;
    WHILE lo < pages LOOP
        RETURN QUERY EXECUTE format(
            'SELECT b.ids[r.query], r.rank, r.ctid, r.distance
               FROM (SELECT array_agg(q.ctid ORDER BY q.ctid) AS ids,
                            array_agg(q.%1$I::real[] ORDER BY q.ctid) AS m
                       FROM %2$s q
                      WHERE q.ctid >= ''(%3$s,0)''::tid AND q.ctid < ''(%4$s,0)''::tid
                        AND q.%1$I IS NOT NULL) b,
                    gpu_graph_search_batch($1, b.m, $2, $3) r',
            "column", queries, lo, lo + step)
        USING index, k, ef;
        lo := lo + step;
    END LOOP;
END $$;
COMMENT ON FUNCTION gpu_graph_knn_join(regclass, regclass, name, int, int, int) IS
    'every row of a table as a query: its k nearest visible rows of the index''s table as (query_ctid, rank, ctid, distance), read and searched a chunk of rows at a time';
