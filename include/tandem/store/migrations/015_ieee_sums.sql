-- Sums that no legal value can make fail (issue 46).
--
-- PostgreSQL's sum(double precision) raises "value out of range: overflow" when two finite values add up past
-- ±1.8e308; Spark, Python and IEEE 754 give ±Infinity there. ieee_sum is that sum: the roll-ups and merges use
-- PostgreSQL's own sum first and this one only after an overflow (a PL/pgSQL call per row is slower).
-- A long sum that leaves the 64-bit range is NULL (Spark's try_sum), so the trades' quantity_sum may be NULL.

CREATE OR REPLACE FUNCTION ieee_add(total double precision, value double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF value IS NULL THEN
        RETURN total;
    ELSIF total IS NULL THEN
        RETURN value;
    ELSIF abs(total) < 8.98846567431158e307 AND abs(value) < 8.98846567431158e307 THEN
        RETURN total + value;  -- two values under half the range cannot overflow
    END IF;
    BEGIN
        RETURN total + value;  -- infinities and NaN add without an error; only finite + finite can overflow
    EXCEPTION WHEN numeric_value_out_of_range THEN
        RETURN CASE WHEN total > 0 THEN 'Infinity'::double precision ELSE '-Infinity'::double precision END;
    END;
END
$$;

CREATE OR REPLACE AGGREGATE ieee_sum(double precision) (SFUNC = ieee_add, STYPE = double precision);

ALTER TABLE trade_aggregates ALTER COLUMN quantity_sum DROP NOT NULL;
