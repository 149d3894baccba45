-- The SQL surface: access method, operators, functions, operator classes.
CREATE EXTENSION gpu_graph;

SELECT amname, amtype FROM pg_am WHERE amname = 'gpu_graph';
SELECT opcname, opcdefault FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod
 WHERE a.amname = 'gpu_graph' ORDER BY opcname;

SELECT ARRAY[0,0]::real[] <-> ARRAY[3,4]::real[] AS l2,
       l2_distance(ARRAY[1,1]::real[], ARRAY[1,1]::real[]) AS l2_zero,
       ARRAY[1,0]::real[] <=> ARRAY[0,1]::real[] AS cos_orthogonal,
       round((ARRAY[1,1]::real[] <=> ARRAY[2,2]::real[])::numeric, 6) AS cos_parallel,
       cosine_distance(ARRAY[1,0]::real[], ARRAY[-1,0]::real[]) AS cos_opposite,
       ARRAY[1,2,3]::real[] <#> ARRAY[4,5,6]::real[] AS neg_ip,
       inner_product(ARRAY[1,2,3]::real[], ARRAY[4,5,6]::real[]) AS ip;

-- cosine distance of a zero vector has no value
SELECT cosine_distance(ARRAY[0,0]::real[], ARRAY[1,0]::real[]) AS cos_zero;
-- NULL in, NULL out (strict)
SELECT NULL::real[] <-> ARRAY[1]::real[] AS null_distance;

-- bad input to the operators
SELECT ARRAY[1,2]::real[] <-> ARRAY[1,2,3]::real[];
SELECT ARRAY[1,NULL]::real[] <-> ARRAY[1,2]::real[];
SELECT ARRAY[[1,2],[3,4]]::real[] <-> ARRAY[1,2,3,4]::real[];
