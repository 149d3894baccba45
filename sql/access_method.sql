
CREATE FUNCTION gpu_graph_amhandler(internal) RETURNS index_am_handler
    AS 'MODULE_PATHNAME', 'gpu_graph_amhandler' LANGUAGE C;
CREATE ACCESS METHOD gpu_graph TYPE INDEX HANDLER gpu_graph_amhandler;
COMMENT ON ACCESS METHOD gpu_graph IS 'approximate nearest-neighbour graph index';

CREATE OPERATOR CLASS real_l2_ops DEFAULT FOR TYPE real[] USING gpu_graph AS
    OPERATOR 1 <-> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 l2_distance(real[], real[]);
CREATE OPERATOR CLASS real_cosine_ops FOR TYPE real[] USING gpu_graph AS
    OPERATOR 1 <=> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 cosine_distance(real[], real[]);
CREATE OPERATOR CLASS real_ip_ops FOR TYPE real[] USING gpu_graph AS
    OPERATOR 1 <#> (real[], real[]) FOR ORDER BY float_ops,
    FUNCTION 1 negative_inner_product(real[], real[]);
