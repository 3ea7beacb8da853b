-- name: FenceAdvance :execrows
-- Advances the high-water mark of @resource to @token inside the caller's transaction, or
-- leaves it alone when a larger token has been seen (0 rows). Equal tokens pass, so one holder
-- may make several fenced writes with its grant. The row lock taken here is held until the
-- caller's transaction ends, so fenced writes to one resource commit in token order. It raises
-- synchronous_commit from off to on for the caller's transaction (any other setting already
-- waits for the local flush, and is kept): an acknowledged fenced write lost in a crash would
-- take the high-water mark back with it, and let an older token through again. A token larger
-- than every token the database has issued is refused before anything is written
-- (fencelock.check_issued raises FL008): it would pass here and then refuse every legitimate
-- holder. A high-water mark above every issued token (written before migration 00017) proves
-- no newer grant, and is replaced (fencelock.issued_bound, read only on that path).
INSERT INTO fencelock.fences AS f (resource, token)
SELECT sqlc.arg(resource)::text, fencelock.check_issued(sqlc.arg(token)::bigint)
FROM (SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, true)) AS cfg
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE f.token <= excluded.token OR f.token > fencelock.issued_bound();

-- name: FenceCurrent :one
-- Reads the high-water mark of @resource; used only to describe a rejection.
SELECT f.token FROM fencelock.fences AS f WHERE f.resource = sqlc.arg(resource)::text;
