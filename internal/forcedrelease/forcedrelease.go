// Package forcedrelease runs fencelock.force_release, the operator's forced release of a
// lease, for its two callers: the fencelock command (`fencelock release --force`) and the live
// view's release button (package ui). The checks and messages around it are each caller's;
// the statements, the lock timeout and the reading of lock errors are here, once.
package forcedrelease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Result is fencelock.force_release's row. OldHolder and OldToken are the lease's last grant
// (nil when it never had one, or not since its last forced release); Lapsed says that grant
// had expired already; NewToken fences it out (nil when expected did not match: nothing
// changed); HandedTo is the waiter that got the lease with NewToken, if any. Woken is, for a
// semaphore's permit (<semaphore>#<slot>, migration 00018) that was freed rather than given,
// the head of the semaphore's queue, told to take it (its own attempt was running at that
// instant, or it does not listen): nil when nobody waited.
type Result struct {
	OldHolder *string
	OldToken  *int64
	Lapsed    bool
	NewToken  *int64
	HandedTo  *string
	Woken     *string
}

// SetLockTimeout sets tx's lock_timeout to d, rounded up to whole milliseconds (0: wait
// without limit), so that a statement waiting for the lease row (held by a RunLocked or a
// holder's guarded transaction) gives up with SQLSTATE 55P03.
func SetLockTimeout(ctx context.Context, tx pgx.Tx, d time.Duration) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, LockTimeoutSetting(d)); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	return nil
}

// LockTimeoutSetting renders d for lock_timeout, in whole milliseconds (at least 1 unless d
// is 0, which waits without limit).
func LockTimeoutSetting(d time.Duration) string {
	ms := d.Milliseconds()
	if d > 0 && ms == 0 {
		ms = 1
	}
	return fmt.Sprintf("%dms", ms)
}

// Run calls fencelock.force_release(name, fences, expected) in tx: it ends the lease's last
// grant (only the one with token expected, when expected is not nil), hands the lease to the
// head of its queue with a fresh token (for a semaphore's permit, the head of the semaphore's
// queue, or frees the permit and tells that head to take it) or leaves it free, and raises the high-water mark of
// each of fences to that token. Committing or rolling back is the caller's. Errors are the
// statement's; [LockTimeout] and [Deadlock] tell the two a caller retries.
func Run(ctx context.Context, tx pgx.Tx, name string, fences []string, expected *int64) (Result, error) {
	var r Result
	var lapsed *bool
	err := tx.QueryRow(ctx, `SELECT old_holder, old_token, lapsed, new_token, handed_to, woken FROM fencelock.force_release($1, $2, $3)`,
		name, fences, expected).Scan(&r.OldHolder, &r.OldToken, &lapsed, &r.NewToken, &r.HandedTo, &r.Woken)
	r.Lapsed = lapsed != nil && *lapsed
	return r, err
}

// LockTimeout reports whether err is lock_not_available (55P03): the lease row stayed locked
// longer than the lock timeout.
func LockTimeout(err error) bool { return sqlState(err) == "55P03" }

// Deadlock reports whether err is deadlock_detected (40P01): PostgreSQL ended the release to
// break a deadlock with a transaction of the holder that locked a fence row before the lease
// row.
func Deadlock(err error) bool { return sqlState(err) == "40P01" }

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
