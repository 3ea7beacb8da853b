package advisory

import (
	"context"
	"fmt"

	"github.com/fencelock/fencelock/internal/db"
)

// keyMatchSQL matches the pg_locks row l of advisory key ($2 pair, $3 int64 key, $4 and $5 the
// pair's halves) held or awaited by backend $1 in this database. Postgres stores an int64 key
// as classid (its high 32 bits) and objid (its low 32 bits) with objsubid 1, and a pair as
// classid and objid with objsubid 2 (the int32 halves read as unsigned).
const keyMatchSQL = `l.pid = $1 AND l.locktype = 'advisory'
	AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
	AND CASE WHEN $2::boolean
	         THEN l.objsubid = 2 AND l.classid::bigint = ($4::int4::bigint & 4294967295)
	              AND l.objid::bigint = ($5::int4::bigint & 4294967295)
	         ELSE l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = $3::bigint END`

// Plain SQL, not sqlc's: sqlc's catalog has no pg_locks.
const (
	cancelWaitSQL = `SELECT pg_catalog.count(pg_catalog.pg_cancel_backend(l.pid)) FROM pg_locks AS l WHERE NOT l.granted AND ` + keyMatchSQL
	keyHeldSQL    = `SELECT EXISTS (SELECT 1 FROM pg_locks AS l WHERE ` + keyMatchSQL + `)`
)

// EndAbandonedWait ends what a lock statement that its caller gave up on (ctx ended while the
// statement was in flight) may still do on the server: the backend with pid may still wait in
// key's queue, unaware that its client left, or may have been granted key just as the client
// gave up, and hold it until it notices. It cancels such a wait, then polls conn every 2 ms
// until the backend neither waits for nor holds key (it exited, or its transaction ended), or
// ctx ends. Only a backend that waits for this very key in this database is ever cancelled:
// behind a pooler, pid may not be the backend's own. There is no event to wait on.
func EndAbandonedWait(ctx context.Context, conn db.DBTX, pid uint32, key Key) error {
	args := []any{int32(pid), key.Pair, key.Int64, key.K1, key.K2}
	var cancelled int64
	if err := conn.QueryRow(ctx, cancelWaitSQL, args...).Scan(&cancelled); err != nil {
		return fmt.Errorf("cancel the abandoned lock wait of backend %d: %w", pid, err)
	}
	return db.AwaitFalse(ctx, conn, fmt.Sprintf("await the end of backend %d's lock on %v", pid, key), keyHeldSQL, args...)
}
