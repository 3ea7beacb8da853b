-- name: FenceAdvance :execrows
-- Advances the high-water mark of @resource to @token inside the caller's transaction, or
-- leaves it alone when a larger token has been seen (0 rows). Equal tokens pass, so one holder
-- may make several fenced writes with its grant. The row lock taken here is held until the
-- caller's transaction ends, so fenced writes to one resource commit in token order.
INSERT INTO fencelock.fences AS f (resource, token)
VALUES (sqlc.arg(resource)::text, sqlc.arg(token)::bigint)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE f.token <= excluded.token;

-- name: FenceCurrent :one
-- Reads the high-water mark of @resource; used only to describe a rejection.
SELECT f.token FROM fencelock.fences AS f WHERE f.resource = sqlc.arg(resource)::text;
