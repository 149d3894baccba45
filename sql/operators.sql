
CREATE FUNCTION l2_distance(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpu_graph_l2_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION cosine_distance(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpu_graph_cosine_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION inner_product(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpu_graph_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION negative_inner_product(real[], real[]) RETURNS float8
    AS 'MODULE_PATHNAME', 'gpu_graph_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE OPERATOR <-> (LEFTARG = real[], RIGHTARG = real[], PROCEDURE = l2_distance, COMMUTATOR = '<->');
CREATE OPERATOR <=> (LEFTARG = real[], RIGHTARG = real[], PROCEDURE = cosine_distance, COMMUTATOR = '<=>');
CREATE OPERATOR <#> (LEFTARG = real[], RIGHTARG = real[], PROCEDURE = negative_inner_product, COMMUTATOR = '<#>');
