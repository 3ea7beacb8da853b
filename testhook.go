package fencelock

import (
	"context"

	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/testhook"
)

// The hooks of internal/testhook, for fencelock's own test modules; see that package.
func init() {
	testhook.ExecOnSession = func(ctx context.Context, lock any, sql string) error {
		lk := lock.(*AdvisoryLock)
		lk.connMu.Lock()
		defer lk.connMu.Unlock()
		if lk.conn == nil {
			return ErrNotHeld
		}
		_, err := lk.conn.Exec(ctx, sql)
		return err
	}
	testhook.SetAfterGrant = func(lessor any, f func()) { lessor.(*Lessor).afterGrant = f }
	testhook.Wakeups = queue.WakeupsSent
	testhook.EndAbandonedGrant = func(ctx context.Context, lessor any, pid uint32) error {
		return lessor.(*Lessor).endAbandonedGrant(ctx, pid)
	}
}
