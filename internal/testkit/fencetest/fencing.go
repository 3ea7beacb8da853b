package fencetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// CreateWrites creates the table writes (resource, token) of [FencedWrite] in pool's database.
func CreateWrites(t testing.TB, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(ctx, `CREATE TABLE writes (resource text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
}

// FencedWrite is the protected write of the fencing tests: in one transaction, advance the
// fence of resource to token and insert the row (resource, token) into the table writes (see
// [CreateWrites]).
func FencedWrite(ctx context.Context, pool *pgxpool.Pool, resource string, token fencelock.Token) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fencelock.FenceTx(ctx, tx, resource, token); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, resource, int64(token))
		return err
	})
}

// WrittenTokens returns the tokens of the rows [FencedWrite] wrote for resource, in ascending
// order.
func WrittenTokens(t testing.TB, ctx context.Context, pool *pgxpool.Pool, resource string) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT token FROM writes WHERE resource = $1 ORDER BY token`, resource)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return got
}

// FenceOnly advances the fence of resource to token through the Go API, in a transaction of
// its own.
func FenceOnly(ctx context.Context, pool *pgxpool.Pool, resource string, token fencelock.Token) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fencelock.FenceTx(ctx, tx, resource, token) })
}

// TokenPath issues one fencing token the way one API path does, the i-th of a test (a name of
// its own), and leaves nothing behind that would flush the WAL (no release, no unlock).
type TokenPath func(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error)

// LeaseGrantToken is the [TokenPath] of a lease: TryAcquire of "lease:<i>" for a minute.
func LeaseGrantToken(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
	lease, err := NewLessor(t, pool, "grant").TryAcquire(ctx, fmt.Sprintf("lease:%d", i), time.Minute)
	if err != nil {
		return 0, err
	}
	return lease.Token(), nil
}

// RunLockedToken is the [TokenPath] of a lease in the caller's transaction: RunLocked of
// "tx:<i>".
func RunLockedToken(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
	var token fencelock.Token
	err := NewLessor(t, pool, "tx").RunLocked(ctx, fmt.Sprintf("tx:%d", i), func(_ context.Context, _ pgx.Tx, tok fencelock.Token) error {
		token = tok
		return nil
	})
	return token, err
}

// AdvisorySessionToken is the [TokenPath] of an advisory session lock with fencing tokens:
// TryLock of "adv:<i>", held until the test's cleanup.
func AdvisorySessionToken(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
	a, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
	require.NoError(t, err)
	lk, err := a.TryLock(ctx, fmt.Sprintf("adv:%d", i))
	if err != nil {
		return 0, err
	}
	// Held until a crash ends its session; Unlock then hands the connection back (closed),
	// which the pool's Close at cleanup waits for.
	t.Cleanup(func() { _ = lk.Unlock(context.Background()) })
	return lk.Token(), nil
}

// AdvisoryTransactionToken is the [TokenPath] of an advisory transaction lock with fencing
// tokens: TryLockTx of "advtx:<i>" in a transaction of its own.
func AdvisoryTransactionToken(t *testing.T, ctx context.Context, pool *pgxpool.Pool, i int) (fencelock.Token, error) {
	a, err := fencelock.NewAdvisoryLocker(pool, fencelock.WithFencingTokens())
	require.NoError(t, err)
	var token fencelock.Token
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		token, err = a.TryLockTx(ctx, tx, fmt.Sprintf("advtx:%d", i))
		return err
	})
	return token, err
}

// TokenPaths are the API paths that issue fencing tokens, each named (Desc) and with its
// [TokenPath] (Issue): a lease's grant, RunLocked, and advisory session and transaction locks
// with fencing tokens.
var TokenPaths = []struct {
	Desc  string
	Issue TokenPath
}{
	{"LeaseGrant", LeaseGrantToken},
	{"RunLocked", RunLockedToken},
	{"AdvisorySession", AdvisorySessionToken},
	{"AdvisoryTransaction", AdvisoryTransactionToken},
}
