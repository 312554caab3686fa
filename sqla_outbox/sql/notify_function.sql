-- Wake LISTENing relays when rows are staged. Statement-level, so one INSERT of a thousand rows
-- notifies once; PostgreSQL also folds identical notifications of one transaction into one, and
-- delivers them only if that transaction commits. A rolled-back enqueue wakes nobody.
CREATE OR REPLACE FUNCTION %(fullname)s_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sqla_outbox', '');
    RETURN NULL;
END
$$
