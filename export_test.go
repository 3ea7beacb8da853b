package fencelock

import (
	"context"

	"github.com/fencelock/fencelock/internal/db"
)

// ExecOnSession runs sql on the session that holds lk, for tests that must break a session's
// state from inside (pg_advisory_unlock_all, say).
func (lk *AdvisoryLock) ExecOnSession(ctx context.Context, sql string) error {
	lk.connMu.Lock()
	defer lk.connMu.Unlock()
	_, err := lk.conn.Exec(ctx, sql)
	return err
}

// SetAfterGrant makes l run f after each grant statement returns, before its reply is used:
// tests use it to make a reply arrive late.
func SetAfterGrant(l *Lessor, f func()) { l.afterGrant = f }

// StatementSQL returns the SQL text of the generated query called name ("LeaseRenew").
func StatementSQL(name string) string { return db.Statement(name) }

// EndAbandonedGrant runs l's cleanup of a grant abandoned on the backend with pid.
func EndAbandonedGrant(ctx context.Context, l *Lessor, pid uint32) error {
	return l.endAbandonedGrant(ctx, pid)
}
