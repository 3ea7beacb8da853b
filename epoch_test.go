package fencelock_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/migrations"
	"github.com/fencelock/fencelock/pgtest"
)

func TestTokenEpochAndSequence(t *testing.T) {
	t.Parallel()
	require.Equal(t, 47, fencelock.TokenSequenceBits)
	for _, tc := range []struct {
		token fencelock.Token
		epoch uint32
		seq   int64
	}{
		{1, 0, 1},                                  // issued before migration 00003
		{1<<47 - 1, 0, 1<<47 - 1},                  // the last of those
		{1<<47 | 1, 1, 1},                          // timeline 1, first sequence value
		{3<<47 | 12345, 3, 12345},                  // after two promotions
		{math.MaxInt64, 65535, 1<<47 - 1},          // the last token there can be
		{fencelock.Token(65535)<<47 | 7, 65535, 7}, // the last epoch
	} {
		require.Equal(t, tc.epoch, tc.token.Epoch(), "Epoch of %d", tc.token)
		require.Equal(t, tc.seq, tc.token.Sequence(), "Sequence of %d", tc.token)
	}
}

// timelineOf returns the timeline the server behind pool writes WAL on.
func timelineOf(t *testing.T, ctx context.Context, pool *pgxpool.Pool) uint32 {
	t.Helper()
	var tli int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8))::bit(32)::bigint`).Scan(&tli))
	return uint32(tli)
}

// Every token path draws epoch tokens: the epoch is the server's timeline.
func TestTokensCarryTheTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tli := timelineOf(t, b.ctx, b.pool)
	for i, tc := range tokenPaths {
		token, err := tc.issue(t, b.ctx, b.pool, i)
		require.NoError(t, err, tc.desc)
		require.Equal(t, tli, token.Epoch(), tc.desc)
		require.Positive(t, token.Sequence(), tc.desc)
	}
}

// After a promotion, every token on every path is larger than every token the old primary
// issued, even when the promotion lost the last sequence increments. The standby lags (its
// WAL sender is paused) while each path issues more tokens than nextval logs ahead (32), so
// the promoted server's sequence is behind: its plain sequence values repeat those of the old
// primary (checked, as a control), and only the epoch keeps tokens rising. With a synchronous
// standby nothing is lost, and even the sequence values rise.
func TestTokensRiseAcrossFailover(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"async-lagged", "sync"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			primary := pgtest.NewServer(t, pgtest.Crashable())
			db := primary.NewDB(t)
			standby := primary.NewStandby(t)
			url, err := pgtest.ClusterURL(db.Name, primary, standby)
			require.NoError(t, err)
			pool, err := pgxpool.New(ctx, url+"&pool_max_conns=64") // each advisory session lock keeps a connection
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			if mode == "sync" {
				require.NoError(t, primary.SetSynchronousStandbys(ctx, "*"))
			}

			var old []fencelock.Token
			issue := func(round, n int) {
				for _, tc := range tokenPaths {
					for i := range n {
						token, err := tc.issue(t, ctx, pool, round*1000+i)
						require.NoError(t, err, tc.desc)
						old = append(old, token)
					}
				}
			}
			issue(0, 5)
			if mode == "async-lagged" {
				require.NoError(t, primary.WaitReplay(ctx, standby))
				_, err := primary.PauseWALSenders(ctx)
				require.NoError(t, err)
			}
			issue(1, 40)
			maxOld := fencelock.Token(0)
			for _, tok := range old {
				maxOld = max(maxOld, tok)
			}

			require.NoError(t, primary.Crash(ctx))
			require.NoError(t, standby.Promote(ctx))
			if mode == "sync" {
				require.NoError(t, standby.SetSynchronousStandbys(ctx, ""))
			}
			pool.Reset()
			awaitReconnect(t, ctx, pool)
			for _, tc := range tokenPaths {
				token, err := tc.issue(t, ctx, pool, 2000)
				require.NoError(t, err, tc.desc)
				require.Greater(t, token, maxOld, "%s: a token after the promotion is not above the old primary's", tc.desc)
				require.Equal(t, maxOld.Epoch()+1, token.Epoch(), tc.desc)
				if mode == "async-lagged" {
					require.Less(t, token.Sequence(), maxOld.Sequence(), "%s: control: the promotion lost sequence increments", tc.desc)
				} else {
					require.Greater(t, token.Sequence(), maxOld.Sequence(), "%s: a synchronous standby loses no increment", tc.desc)
				}
			}
		})
	}
}

// gooseProvider returns a goose provider for fencelock's migrations on pool, as Migrate has it.
func gooseProvider(t *testing.T, pool *pgxpool.Pool) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(fencelock.VersionTable), goose.WithDisableGlobalRegistry(true), goose.WithLogger(goose.NopLogger()))
	require.NoError(t, err)
	return p
}

// A database migrated before epoch tokens issued plain sequence values; after migration 00003
// every new token is larger than all of them.
func TestMigrationEpochTokensAboveEarlierTokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := gooseProvider(t, b.pool)
	_, err := p.DownTo(b.ctx, 2)
	require.NoError(t, err)
	var before []fencelock.Token
	for i, tc := range tokenPaths {
		token, err := tc.issue(t, b.ctx, b.pool, i)
		require.NoError(t, err, tc.desc)
		require.Zero(t, token.Epoch(), "%s: before migration 00003, a plain sequence value", tc.desc)
		before = append(before, token)
	}
	require.NoError(t, fencelock.Migrate(b.ctx, b.pool))
	for i, tc := range tokenPaths {
		token, err := tc.issue(t, b.ctx, b.pool, 100+i)
		require.NoError(t, err, tc.desc)
		for _, old := range before {
			require.Greater(t, token, old, tc.desc)
		}
		require.Equal(t, timelineOf(t, b.ctx, b.pool), token.Epoch(), tc.desc)
	}
}

// Migration 00003 refuses a sequence already past what epoch tokens leave for it, and leaves
// the database at version 2.
func TestMigrationRefusesSequencePastBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := gooseProvider(t, b.pool)
	_, err := p.DownTo(b.ctx, 2)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `SELECT setval('fencelock.leases_token_seq', $1::bigint)`, int64(1)<<47)
	require.NoError(t, err)
	err = fencelock.Migrate(b.ctx, b.pool)
	require.ErrorIs(t, err, fencelock.ErrTokenBudget)
	v, err := p.GetDBVersion(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
}

// Past the last sequence value, every path refuses with ErrTokenBudget, and holds nothing.
func TestTokenBudgetExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.pool.Exec(b.ctx, `SELECT setval('fencelock.leases_token_seq', $1::bigint)`, int64(1)<<47-2)
	require.NoError(t, err)
	last, err := tokenPaths[0].issue(t, b.ctx, b.pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1)<<47-1, last.Sequence(), "the last sequence value is still issued")
	for i, tc := range tokenPaths {
		_, err := tc.issue(t, b.ctx, b.pool, 10+i)
		require.ErrorIs(t, err, fencelock.ErrTokenBudget, tc.desc)
	}
	var leases, flushes, advisory int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM fencelock.leases WHERE token > 0 AND name <> 'lease:0'),
		(SELECT count(*) FROM fencelock.token_flushes),
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')`).Scan(&leases, &flushes, &advisory))
	require.Zero(t, leases, "a refused grant left a lease row")
	require.Zero(t, flushes, "a refused advisory token left its flush row")
	require.Zero(t, advisory, "a refused advisory token left its lock held")
}
