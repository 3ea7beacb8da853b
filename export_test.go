package fencelock

import "context"

// ExecOnSession runs sql on the session that holds lk, for tests that must break a session's
// state from inside (pg_advisory_unlock_all, say).
func (lk *AdvisoryLock) ExecOnSession(ctx context.Context, sql string) error {
	lk.connMu.Lock()
	defer lk.connMu.Unlock()
	_, err := lk.conn.Exec(ctx, sql)
	return err
}
