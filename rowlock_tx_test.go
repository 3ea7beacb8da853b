package fencelock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

func TestRunLocked(t *testing.T) {
	t.Parallel()

	t.Run("ExcludesTTLHoldersAndIssuesFreshToken", func(t *testing.T) {
		b, a, c := twoLessors(t, false)
		createWrites(t, b)
		prev, err := c.TryAcquire(b.Ctx, "job", time.Second)
		require.NoError(t, err)
		// While a TTL holder has the lease, the transaction mode is refused.
		err = a.TryRunLocked(b.Ctx, "job", func(context.Context, pgxTx, fencelock.Token) error {
			t.Error("fn ran while a TTL holder had the lease")
			return nil
		})
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		require.NoError(t, prev.Release(b.Ctx))

		var got fencelock.Token
		err = a.TryRunLocked(b.Ctx, "job", func(ctx context.Context, tx pgxTx, token fencelock.Token) error {
			got = token
			// While the transaction holds the row, TTL grants are refused.
			_, err := c.TryAcquire(ctx, "job", time.Second)
			require.ErrorIs(t, err, fencelock.ErrNotAcquired)
			if err := fencelock.FenceTx(ctx, tx, "job", token); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO writes VALUES ('job', $1)`, int64(token))
			return err
		})
		require.NoError(t, err)
		require.Greater(t, got, prev.Token())
		require.Equal(t, []int64{int64(got)}, writtenTokens(t, b, "job"))

		// Commit released it: a TTL grant succeeds at once, with a larger token.
		next, err := c.TryAcquire(b.Ctx, "job", time.Second)
		require.NoError(t, err)
		require.Greater(t, next.Token(), got)
		require.NoError(t, next.Release(b.Ctx))
	})

	t.Run("FnErrorRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		createWrites(t, b)
		a := newLessor(t, b.Pool, "a")
		err := a.TryRunLocked(b.Ctx, "job", func(ctx context.Context, tx pgxTx, token fencelock.Token) error {
			_, err := tx.Exec(ctx, `INSERT INTO writes VALUES ('job', $1)`, int64(token))
			require.NoError(t, err)
			return errBoom
		})
		require.ErrorIs(t, err, errBoom)
		require.Empty(t, writtenTokens(t, b, "job"))
		l, err := a.TryAcquire(b.Ctx, "job", time.Second)
		require.NoError(t, err)
		require.NoError(t, l.Release(b.Ctx))
	})

	t.Run("FnErrorMatchingNotAcquiredIsNotRetried", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := newLessor(t, b.Pool, "a")
		runs := 0
		fnErr := fmt.Errorf("nested lock: %w", fencelock.ErrNotAcquired)
		err := a.RunLocked(b.Ctx, "job", func(context.Context, pgxTx, fencelock.Token) error {
			runs++
			return fnErr
		})
		require.ErrorIs(t, err, fnErr)
		require.Equal(t, 1, runs)
		runs = 0
		err = a.TryRunLocked(b.Ctx, "job", func(context.Context, pgxTx, fencelock.Token) error {
			runs++
			return fnErr
		})
		require.ErrorIs(t, err, fnErr)
		require.Equal(t, 1, runs)
	})

	t.Run("WaitingVariantQueuesBehindTransaction", func(t *testing.T) {
		b, a, c := twoLessors(t, false)
		inside, finish := make(chan struct{}), make(chan struct{})
		var first, second fencelock.Token
		done := make(chan error, 1)
		go func() {
			done <- a.RunLocked(b.Ctx, "job", func(_ context.Context, _ pgxTx, token fencelock.Token) error {
				first = token
				close(inside)
				<-finish
				return nil
			})
		}()
		<-inside
		err := c.TryRunLocked(b.Ctx, "job", func(context.Context, pgxTx, fencelock.Token) error { return nil })
		require.ErrorIs(t, err, fencelock.ErrNotAcquired)
		close(finish)
		require.NoError(t, c.RunLocked(b.Ctx, "job", func(_ context.Context, _ pgxTx, token fencelock.Token) error {
			second = token
			return nil
		}))
		require.NoError(t, <-done)
		require.Greater(t, second, first)
	})

	t.Run("WaitsOutTTLHolder", func(t *testing.T) {
		b, a, c := twoLessors(t, true)
		la, err := a.Acquire(b.Ctx, "job", 200*time.Millisecond)
		require.NoError(t, err)
		var got fencelock.Token
		require.NoError(t, c.RunLocked(b.Ctx, "job", func(_ context.Context, _ pgxTx, token fencelock.Token) error {
			got = token
			return nil
		}))
		require.Greater(t, got, la.Token())
	})
}
