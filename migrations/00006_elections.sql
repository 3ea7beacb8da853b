-- +goose Up
-- Leader election on leases (issue 12): a term is a lease grant of the election's name, its
-- fencing token the term's; the value a leader proclaims is kept here, per name, tagged with
-- the token of the term that proclaimed it, so a value left by an earlier term is never read
-- as the current leader's.
CREATE TABLE fencelock.election_values (
    name          text        PRIMARY KEY,
    token         bigint      NOT NULL,
    value         text        NOT NULL,
    proclaimed_at timestamptz NOT NULL,
    CONSTRAINT election_values_name_length CHECK (octet_length(name) BETWEEN 1 AND 1024),
    CONSTRAINT election_values_value_length CHECK (octet_length(value) <= 4096)
) WITH (fillfactor = 70);

-- The current leader of every election: the unexpired grant of each name that has proclaimed
-- a value once, with the value of the current term (NULL until it proclaims).
CREATE VIEW fencelock.leaders AS
SELECT l.name, l.holder, l.token,
       CASE WHEN v.token = l.token THEN v.value END AS value,
       l.acquired_at AS elected_at,
       l.expires_at
FROM fencelock.election_values AS v
JOIN fencelock.leases AS l ON l.name = v.name
WHERE l.token > 0 AND l.expires_at > clock_timestamp();

-- fencelock.grant_to_lease_roles(privileges, objects) grants privileges on objects to every
-- role that may insert into fencelock.leases (and to PUBLIC where PUBLIC may), as migrations
-- 00004 and 00005 did inline: roles that take leases may use what a migration adds. For
-- migrations only (EXECUTE revoked from PUBLIC).
-- +goose StatementBegin
CREATE FUNCTION fencelock.grant_to_lease_roles(privileges text, objects text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
        WHERE c.oid = 'fencelock.leases'::regclass
          AND a.privilege_type = 'INSERT' AND a.grantee <> 0
          AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %s TO %s', privileges, objects, r);
    END LOOP;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c, LATERAL pg_catalog.aclexplode(c.relacl) AS a
               WHERE c.oid = 'fencelock.leases'::regclass
                 AND a.privilege_type = 'INSERT' AND a.grantee = 0) THEN
        EXECUTE format('GRANT %s ON %s TO PUBLIC', privileges, objects);
    END IF;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION fencelock.grant_to_lease_roles(text, text) FROM PUBLIC;

-- Roles that take leases may campaign.
SELECT fencelock.grant_to_lease_roles('SELECT, INSERT, UPDATE, DELETE', 'fencelock.election_values');
SELECT fencelock.grant_to_lease_roles('SELECT', 'fencelock.leaders');

-- +goose Down
DROP FUNCTION fencelock.grant_to_lease_roles(text, text);
DROP VIEW fencelock.leaders;
DROP TABLE fencelock.election_values;
