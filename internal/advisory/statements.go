package advisory

import (
	"context"

	"github.com/fencelock/fencelock/internal/db"
)

var queries = db.New()

// Request is what a lock statement takes: the key, labelled by Name ("" for a lock taken by
// key), in shared or exclusive mode, waiting in the server's queue or only trying, with or
// without a fencing token.
type Request struct {
	Name   string
	Key    Key
	Shared bool
	Wait   bool
	Tokens bool
}

// LockSession takes r's session lock on conn, a connection of the lock's own, in one statement
// (AdvisoryLock), and names it in application_name (applicationName). startupPID is the
// backend pid the connection reported at startup, checked against the server's before it
// locks; 0 skips the check (a declared session pooler). The row says whether it was granted,
// or why the session was refused (in recovery, another pid); the caller turns that into
// errors. pgx's error is returned as is.
func LockSession(ctx context.Context, conn db.DBTX, r Request, startupPID int32) (db.AdvisoryLockRow, error) {
	return queries.AdvisoryLock(ctx, conn, db.AdvisoryLockParams{
		StartupPid: startupPID,
		AppName:    applicationName(r.Name, r.Key),
		Tokens:     r.Tokens,
		Wait:       r.Wait,
		Pair:       r.Key.Pair, K1: r.Key.K1, K2: r.Key.K2, Key: r.Key.Int64,
		Shared: r.Shared,
	})
}

// UnlockSession releases key's session lock on conn (AdvisoryUnlock) and puts prevApp back as
// application_name. released is false when the session did not hold the lock. pgx's error is
// returned as is.
func UnlockSession(ctx context.Context, conn db.DBTX, key Key, shared bool, prevApp string) (released bool, err error) {
	row, err := queries.AdvisoryUnlock(ctx, conn, db.AdvisoryUnlockParams{
		Pair: key.Pair, K1: key.K1, K2: key.K2, Key: key.Int64,
		Shared:              shared,
		PrevApplicationName: prevApp,
	})
	return row.Released, err
}

// LockTx takes r's transaction lock inside tx, the caller's transaction, in one statement
// (AdvisoryLockTx); r.Name is not used. pgx's error is returned as is.
func LockTx(ctx context.Context, tx db.DBTX, r Request) (db.AdvisoryLockTxRow, error) {
	return queries.AdvisoryLockTx(ctx, tx, db.AdvisoryLockTxParams{
		Tokens: r.Tokens,
		Wait:   r.Wait,
		Pair:   r.Key.Pair, K1: r.Key.K1, K2: r.Key.K2, Key: r.Key.Int64,
		Shared: r.Shared,
	})
}
