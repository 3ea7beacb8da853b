-- For sqlc only: sqlc/sqlc.yaml lists this file before schema.sql; no database ever runs it.
--
-- pg_dump writes the pg_catalog relations that a view reads unqualified (pg_catalog is always
-- on PostgreSQL's search path), but sqlc looks an unqualified relation up in schema public
-- only. These views give the names that schema.sql's views read (fencelock.advisory_locks:
-- pg_locks, pg_stat_activity, pg_database) the columns of pg_catalog's relations.
CREATE VIEW pg_locks AS SELECT * FROM pg_catalog.pg_locks;
CREATE VIEW pg_stat_activity AS SELECT * FROM pg_catalog.pg_stat_activity;
CREATE VIEW pg_database AS SELECT * FROM pg_catalog.pg_database;
