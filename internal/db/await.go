package db

// Not generated: sqlc leaves this file alone.

import (
	"context"
	"fmt"
	"time"
)

// AwaitFalse runs query, which returns one boolean, on conn every 2 ms until it returns
// false, or ctx ends. what names the wait in the errors. It is the poll of the cleanups that
// wait for a backend's state (its exit, the end of its transaction, the end of its lock wait):
// Postgres notifies none of them, so there is no event to wait on.
func AwaitFalse(ctx context.Context, conn DBTX, what, query string, args ...any) error {
	for {
		var still bool
		if err := conn.QueryRow(ctx, query, args...).Scan(&still); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if !still {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}
