package fencelock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// setEpochOffset sets fencelock.token_epoch.epoch_offset, as a promotion (a new timeline) or a
// copy onto a server on an earlier timeline would move the epoch: the epoch is the timeline
// plus the offset.
func setEpochOffset(t *testing.T, b *bundle, offset int32) {
	t.Helper()
	_, err := b.Pool.Exec(b.Ctx, `UPDATE fencelock.token_epoch SET epoch_offset = $1`, offset)
	require.NoError(t, err)
}

// epochRecord returns fencelock.token_epoch.last_epoch and the epochs of
// fencelock.token_epoch_marks (migration 00011), in order.
func epochRecord(t *testing.T, b *bundle) (last int32, marks []int32) {
	t.Helper()
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT e.last_epoch,
			coalesce((SELECT array_agg(m.epoch ORDER BY m.epoch) FROM fencelock.token_epoch_marks AS m), '{}')
		FROM fencelock.token_epoch AS e`).Scan(&last, &marks))
	return last, marks
}

// runLockedBlocked starts l.RunLocked(ctx, name) in a goroutine whose fn, once granted, blocks
// until finish is called: it returns the grant's token and finish, which makes fn return ret
// (an error rolls the transaction back, nil commits it) and returns RunLocked's error. If the
// test ends without calling finish, a cleanup calls it with an error.
func runLockedBlocked(t *testing.T, ctx context.Context, l *fencelock.Lessor, name string) (fencelock.Token, func(ret error) error) {
	t.Helper()
	granted := make(chan fencelock.Token, 1)
	proceed := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- l.RunLocked(ctx, name, func(_ context.Context, _ pgx.Tx, token fencelock.Token) error {
			granted <- token
			return <-proceed
		})
	}()
	var once sync.Once
	var result error
	finish := func(ret error) error {
		once.Do(func() {
			proceed <- ret
			result = <-done
		})
		return result
	}
	t.Cleanup(func() { _ = finish(errors.New("test ended")) })
	select {
	case token := <-granted:
		return token, finish
	case err := <-done:
		once.Do(func() { result = err })
		require.NoError(t, err, "RunLocked ended before its grant")
		t.Fatal("RunLocked ended before its grant")
	case <-time.After(30 * time.Second):
		t.Fatal("RunLocked not granted within 30s")
	}
	return 0, nil
}

// requireEpochRowLocked fails the test unless another transaction holds fencelock.token_epoch's
// row locked (FOR UPDATE SKIP LOCKED finds no row to lock).
func requireEpochRowLocked(t *testing.T, b *bundle) {
	t.Helper()
	err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		var n int
		if err := tx.QueryRow(b.Ctx, `SELECT count(*) FROM (SELECT FROM fencelock.token_epoch FOR UPDATE SKIP LOCKED) AS k`).Scan(&n); err != nil {
			return err
		}
		require.Zero(t, n, "nobody holds fencelock.token_epoch's row")
		return errors.New("roll back")
	})
	require.EqualError(t, err, "roll back")
}

// promotedWhileRunLocked grants and releases a token of the server's timeline tli, then acts
// out a promotion (epoch tli + 1) and starts a RunLocked of "first" that draws the new epoch's
// first token, holding fencelock.token_epoch's row to record it until finish(fn's error) ends
// it. It returns the lessor "epoch" of both, tli and finish.
func promotedWhileRunLocked(t *testing.T, b *bundle) (*fencelock.Lessor, uint32, func(error) error) {
	t.Helper()
	l := newLessor(t, b.Pool, "epoch")
	tli := timelineOf(t, b.Ctx, b.Pool)
	old, err := l.TryAcquire(b.Ctx, "old", time.Minute)
	require.NoError(t, err)
	require.Equal(t, tli, old.Token().Epoch())
	require.NoError(t, old.Release(b.Ctx))

	setEpochOffset(t, b, 1) // a promotion: epoch tli + 1
	first, finish := runLockedBlocked(t, b.Ctx, l, "first")
	require.Equal(t, tli+1, first.Epoch(), "the RunLocked drew the new epoch's first token")
	requireEpochRowLocked(t, b)
	return l, tli, finish
}

// The highest epoch that issued a token is recorded durably whatever transaction drew the
// epoch's first token and however it ended (issue 21, defect 2). After a promotion a RunLocked
// draws the epoch's first token, which locks fencelock.token_epoch's row to record the epoch; a
// TryAcquire of the same moment draws a token of the new epoch and commits without waiting for
// that row; the RunLocked then rolls back. A copy of the database onto a server on the earlier
// timeline must refuse grants (ErrTokenEpochBehind) rather than issue tokens below the
// TryAcquire's; RebaseTokenEpoch then raises the epoch above it. Before migration 00011 the
// TryAcquire skipped the record (SKIP LOCKED) and the rollback took the RunLocked's with it:
// last_epoch stayed at the old epoch, and the copy granted a smaller token.
func TestTokenEpochRecordedWhenFirstDrawRollsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, tli, finish := promotedWhileRunLocked(t, b)
	lease, err := l.TryAcquire(b.Ctx, "concurrent", time.Minute)
	require.NoError(t, err, "a grant does not wait for the RunLocked's transaction")
	require.Equal(t, tli+1, lease.Token().Epoch())
	require.NoError(t, lease.Release(b.Ctx))
	errRollback := errors.New("roll back")
	require.ErrorIs(t, finish(errRollback), errRollback)

	setEpochOffset(t, b, 0) // the copy, on a server back on timeline tli
	_, err = l.TryAcquire(b.Ctx, "after-copy", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrTokenEpochBehind, "epoch %d issued %v (committed) but was not recorded", tli+1, lease.Token())
	requireNothingHeld(t, b.Ctx, b.Pool)

	epoch, err := fencelock.RebaseTokenEpoch(b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	require.Equal(t, tli+2, epoch, "above the recorded epoch %d", tli+1)
	after, err := l.TryAcquire(b.Ctx, "after-copy", time.Minute)
	require.NoError(t, err)
	require.Greater(t, after.Token(), lease.Token())
	last, marks := epochRecord(t, b)
	require.EqualValues(t, tli+2, last, "the new epoch's first token recorded it")
	require.Empty(t, marks, "and folded the marks below it away")
}

// Marks (fencelock.token_epoch_marks) that outlive their need, because the transaction that
// held fencelock.token_epoch's row committed the same epoch, are folded away by the next token
// that can lock the row; while a transaction holds it, tokens of an epoch already marked add
// no mark.
func TestTokenEpochMarksFolded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l, tli, finish := promotedWhileRunLocked(t, b)
	for i := range 3 {
		lease, err := l.TryAcquire(b.Ctx, fmt.Sprintf("concurrent:%d", i), time.Minute)
		require.NoError(t, err)
		require.NoError(t, lease.Release(b.Ctx))
	}
	last, marks := epochRecord(t, b)
	require.EqualValues(t, tli, last)
	require.Equal(t, []int32{int32(tli + 1)}, marks, "one mark: later tokens see the epoch marked")
	require.NoError(t, finish(nil))
	last, marks = epochRecord(t, b)
	require.EqualValues(t, tli+1, last, "the RunLocked committed the record")
	require.Equal(t, []int32{int32(tli + 1)}, marks, "the mark of a transaction it could not see is left")

	lease, err := l.TryAcquire(b.Ctx, "fold", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
	last, marks = epochRecord(t, b)
	require.EqualValues(t, tli+1, last)
	require.Empty(t, marks, "the next token folded the mark away")
}

// Migrating down past 00011 folds the marks into last_epoch before it drops
// fencelock.token_epoch_marks: the database still refuses an epoch below every epoch it
// recorded, before and after migrating up again.
func TestMigrationEpochRecordDownFoldsMarks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "epoch")
	tli := timelineOf(t, b.Ctx, b.Pool)
	setEpochOffset(t, b, 1)
	holder, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer holder.Rollback(context.Background())
	_, err = holder.Exec(b.Ctx, `SELECT FROM fencelock.token_epoch FOR UPDATE`)
	require.NoError(t, err)
	lease, err := l.TryAcquire(b.Ctx, "marked", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Release(b.Ctx))
	require.NoError(t, holder.Rollback(b.Ctx))
	last, marks := epochRecord(t, b)
	require.Less(t, last, int32(tli+1))
	require.Equal(t, []int32{int32(tli + 1)}, marks)

	_, err = gooseProvider(t, b.Pool).DownTo(b.Ctx, 10)
	require.NoError(t, err)
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_epoch FROM fencelock.token_epoch`).Scan(&last))
	require.EqualValues(t, tli+1, last, "the mark was folded into last_epoch")
	setEpochOffset(t, b, 0)
	// Today's grant needs fencelock.token_epoch_marks (00011): at version 10 the token is the
	// one that version's grant drew, fencelock.next_token.
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.next_token(false)`)
	require.ErrorIs(t, fencelock.WrapSQLError(err), fencelock.ErrTokenEpochBehind)

	require.NoError(t, fencelock.Migrate(b.Ctx, b.Pool))
	_, err = l.TryAcquire(b.Ctx, "after-copy", time.Minute)
	require.ErrorIs(t, err, fencelock.ErrTokenEpochBehind)
}

// Under REPEATABLE READ a token whose snapshot predates the record of its epoch, or the fold of
// a mark it saw, is still granted: the record is taken by whichever token can, and such a
// token marks the epoch instead (before migration 00011 the first failed with a serialization
// error, "could not serialize access due to concurrent update").
func TestTokenEpochRecordUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := newLessor(t, b.Pool, "epoch")
	a, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithFencingTokens())
	require.NoError(t, err)
	tli := timelineOf(t, b.Ctx, b.Pool)
	grant := func(name string) {
		t.Helper()
		lease, err := l.TryAcquire(b.Ctx, name, time.Minute)
		require.NoError(t, err)
		require.NoError(t, lease.Release(b.Ctx))
	}
	// snapshotThen begins a REPEATABLE READ transaction, takes its snapshot, runs meanwhile in
	// other transactions, and then draws a token in it.
	snapshotThen := func(name string, meanwhile func()) fencelock.Token {
		t.Helper()
		tx, err := b.Pool.BeginTx(b.Ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		defer tx.Rollback(context.Background())
		_, err = tx.Exec(b.Ctx, `SELECT count(*) FROM fencelock.token_epoch_marks`)
		require.NoError(t, err)
		meanwhile()
		token, err := a.TryLockTx(b.Ctx, tx, name)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(b.Ctx))
		return token
	}
	grant("old")
	setEpochOffset(t, b, 1)

	token := snapshotThen("recorded-meanwhile", func() { grant("records") })
	require.Equal(t, tli+1, token.Epoch())
	last, marks := epochRecord(t, b)
	require.EqualValues(t, tli+1, last)
	require.Equal(t, []int32{int32(tli + 1)}, marks, "the token whose snapshot missed the record marked the epoch")

	token = snapshotThen("folded-meanwhile", func() { grant("folds") })
	require.Equal(t, tli+1, token.Epoch())
	last, marks = epochRecord(t, b)
	require.EqualValues(t, tli+1, last)
	require.Empty(t, marks)
}
