package fencelock_test

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/migrations"
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
	tli := timelineOf(t, b.Ctx, b.Pool)
	for i, tc := range fencetest.TokenPaths {
		token, err := tc.Issue(t, b.Ctx, b.Pool, i)
		require.NoError(t, err, tc.Desc)
		require.Equal(t, tli, token.Epoch(), tc.Desc)
		require.Positive(t, token.Sequence(), tc.Desc)
	}
}

// migrationSections returns the Up and Down SQL of one of fencelock's migrations, without
// goose's annotations, to run by hand.
func migrationSections(t *testing.T, file string) (up, down string) {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS, file)
	require.NoError(t, err)
	text := strings.NewReplacer("-- +goose StatementBegin", "", "-- +goose StatementEnd", "").Replace(string(b))
	up, down, ok := strings.Cut(text, "-- +goose Down")
	require.True(t, ok, "%s has no Down section", file)
	return strings.TrimPrefix(up, "-- +goose Up"), down
}

// gooseProvider returns a goose provider for fencelock's migrations on pool, as Migrate has it.
var gooseProvider = fencetest.GooseProvider

// atVersion2 runs t in parallel on a database of its own, migrated down to version 2 (before
// epoch tokens), and returns it with the goose provider that did it.
func atVersion2(t *testing.T) (*bundle, *goose.Provider) {
	t.Helper()
	t.Parallel()
	b := setup(t)
	p := gooseProvider(t, b.Pool)
	_, err := p.DownTo(b.Ctx, 2)
	require.NoError(t, err)
	return b, p
}

// A database migrated before epoch tokens issued plain sequence values; after migration 00003
// every new token is larger than all of them.
func TestMigrationEpochTokensAboveEarlierTokens(t *testing.T) {
	b, _ := atVersion2(t)
	// Today's TryAcquire needs the queue of waiters (migration 00004), which is independent of
	// the tokens: put it in place by hand for the grants at version 2, and take it out again
	// before migrating.
	up, down := migrationSections(t, "00004_lease_queue.sql")
	_, err := b.Pool.Exec(b.Ctx, up)
	require.NoError(t, err)
	// Today's lease grant draws its token inline from what migrations 00003 and 00011 create,
	// so at version 2 the lease paths' tokens are the ones that version's grant drew:
	// fencelock.next_token(false) of migration 00002.
	var before []fencelock.Token
	for i, tc := range fencetest.TokenPaths {
		var token fencelock.Token
		var err error
		if tc.Desc == "LeaseGrant" || tc.Desc == "RunLocked" {
			err = b.Pool.QueryRow(b.Ctx, `SELECT fencelock.next_token(false)`).Scan(&token)
		} else {
			token, err = tc.Issue(t, b.Ctx, b.Pool, i)
		}
		require.NoError(t, err, tc.Desc)
		require.Zero(t, token.Epoch(), "%s: before migration 00003, a plain sequence value", tc.Desc)
		before = append(before, token)
	}
	_, err = b.Pool.Exec(b.Ctx, down)
	require.NoError(t, err)
	require.NoError(t, fencelock.Migrate(b.Ctx, b.Pool))
	for i, tc := range fencetest.TokenPaths {
		token, err := tc.Issue(t, b.Ctx, b.Pool, 100+i)
		require.NoError(t, err, tc.Desc)
		for _, old := range before {
			require.Greater(t, token, old, tc.Desc)
		}
		require.Equal(t, timelineOf(t, b.Ctx, b.Pool), token.Epoch(), tc.Desc)
	}
}

// Migration 00003 refuses a sequence already past what epoch tokens leave for it, and leaves
// the database at version 2.
func TestMigrationRefusesSequencePastBudget(t *testing.T) {
	b, p := atVersion2(t)
	_, err := b.Pool.Exec(b.Ctx, `SELECT setval('fencelock.leases_token_seq', $1::bigint)`, int64(1)<<47)
	require.NoError(t, err)
	err = fencelock.Migrate(b.Ctx, b.Pool)
	require.ErrorIs(t, err, fencelock.ErrTokenBudget)
	v, err := p.GetDBVersion(b.Ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
}

// Past the last sequence value, every path refuses with ErrTokenBudget, and holds nothing.
func TestTokenBudgetExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `SELECT setval('fencelock.leases_token_seq', $1::bigint)`, int64(1)<<47-2)
	require.NoError(t, err)
	last, err := fencetest.LeaseGrantToken(t, b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1)<<47-1, last.Sequence(), "the last sequence value is still issued")
	for i, tc := range fencetest.TokenPaths {
		_, err := tc.Issue(t, b.Ctx, b.Pool, 10+i)
		require.ErrorIs(t, err, fencelock.ErrTokenBudget, tc.Desc)
	}
	requireNothingHeld(t, b.Ctx, b.Pool, "lease:0")
}

// Past the last epoch (65,535: timeline plus offset), every path refuses with ErrTokenBudget
// and holds nothing, and so does a rebase that would pass it.
func TestTokenEpochBudgetExhausted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tli := timelineOf(t, b.Ctx, b.Pool)
	_, err := b.Pool.Exec(b.Ctx, `UPDATE fencelock.token_epoch SET epoch_offset = $1`, int32(65536-tli))
	require.NoError(t, err)
	for i, tc := range fencetest.TokenPaths {
		_, err := tc.Issue(t, b.Ctx, b.Pool, i)
		require.ErrorIs(t, err, fencelock.ErrTokenBudget, tc.Desc)
	}
	requireNothingHeld(t, b.Ctx, b.Pool)

	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.token_epoch SET epoch_offset = 0, last_epoch = 65535`)
	require.NoError(t, err)
	_, err = fencelock.RebaseTokenEpoch(b.Ctx, b.Pool, 0)
	require.ErrorIs(t, err, fencelock.ErrTokenBudget, "the next epoch would be 65,536")
}

// requireNothingHeld checks that refused grants left nothing behind: no lease row with a token
// but those of names in granted, no flush row, no advisory lock.
var requireNothingHeld = testkit.RequireNothingHeld

// A least-privilege role can take tokens on every path: one granted before migration 00003,
// directly or through PUBLIC, keeps working (migrations 00003 and 00011 extend the grants), and
// one granted after needs the list docs/FAILOVER.md gives.
func TestTokenPathsForUnprivilegedRole(t *testing.T) {
	t.Parallel()
	const baseGrants = `GRANT USAGE ON SCHEMA fencelock TO %[1]s;
		GRANT SELECT, INSERT, UPDATE, DELETE ON fencelock.leases, fencelock.fences TO %[1]s;
		GRANT SELECT, INSERT, UPDATE ON fencelock.token_flushes TO %[1]s;
		GRANT USAGE ON SEQUENCE fencelock.leases_token_seq TO %[1]s`
	for _, tc := range []struct {
		desc   string
		before bool // granted before migration 00003
		grants string
	}{
		{"GrantedBeforeMigration", true, baseGrants},
		{"GrantedToPublicBeforeMigration", true, strings.ReplaceAll(baseGrants, "%[1]s", "PUBLIC")},
		{"GrantedAfter", false, baseGrants + `; GRANT SELECT, UPDATE (last_epoch) ON fencelock.token_epoch TO %[1]s;
			GRANT SELECT, INSERT, DELETE ON fencelock.token_epoch_marks TO %[1]s;
			GRANT SELECT, INSERT, UPDATE, DELETE ON fencelock.lease_waiters TO %[1]s;
			GRANT USAGE ON SEQUENCE fencelock.lease_waiters_seq TO %[1]s`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.before {
				_, err := gooseProvider(t, b.Pool).DownTo(b.Ctx, 2)
				require.NoError(t, err)
			}
			role := "app_" + strings.TrimPrefix(b.DB.Name, "t_")
			_, err := b.Pool.Exec(b.Ctx, fmt.Sprintf(`CREATE ROLE %[1]s LOGIN; `+tc.grants, role))
			require.NoError(t, err)
			t.Cleanup(func() {
				_, err := b.Pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role))
				require.NoError(t, err)
			})
			if tc.before {
				require.NoError(t, fencelock.Migrate(b.Ctx, b.Pool))
			}
			u, err := url.Parse(b.DB.URL)
			require.NoError(t, err)
			u.User = url.User(role)
			pool, err := pgxpool.New(b.Ctx, u.String())
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			var super bool
			require.NoError(t, pool.QueryRow(b.Ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super))
			require.False(t, super)
			// The first token of the epoch records it: start from 0. While another transaction
			// holds fencelock.token_epoch's row, the role's tokens mark the epoch
			// (fencelock.token_epoch_marks, migration 00011); once it is free, the next token
			// records it in the row (UPDATE of last_epoch) and folds the mark (DELETE).
			_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.token_epoch SET last_epoch = 0`)
			require.NoError(t, err)
			holder, err := b.Pool.Begin(b.Ctx)
			require.NoError(t, err)
			defer holder.Rollback(context.Background())
			_, err = holder.Exec(b.Ctx, `SELECT FROM fencelock.token_epoch FOR UPDATE`)
			require.NoError(t, err)
			for i, path := range fencetest.TokenPaths {
				token, err := path.Issue(t, b.Ctx, pool, i)
				require.NoError(t, err, path.Desc)
				require.Positive(t, token.Epoch(), path.Desc)
			}
			tli := timelineOf(t, b.Ctx, b.Pool)
			last, marks := epochRecord(t, b)
			require.Zero(t, last)
			require.Equal(t, []int32{int32(tli)}, marks, "the role marked the epoch")
			require.NoError(t, holder.Rollback(b.Ctx))
			for i, path := range fencetest.TokenPaths {
				token, err := path.Issue(t, b.Ctx, pool, 10+i)
				require.NoError(t, err, path.Desc)
				require.Positive(t, token.Epoch(), path.Desc)
			}
			last, marks = epochRecord(t, b)
			require.EqualValues(t, tli, last, "the role recorded the epoch")
			require.Empty(t, marks, "the role folded the mark")
		})
	}
}

// Where the epoch went back (as after pg_upgrade, which starts timeline 1 again, or a restored
// copy), every path refuses with ErrTokenEpochBehind and holds nothing, until RebaseTokenEpoch.
func TestTokenEpochBehindRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := fencetest.LeaseGrantToken(t, b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	var last int32
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_epoch FROM fencelock.token_epoch`).Scan(&last))
	require.EqualValues(t, first.Epoch(), last, "the first token of the epoch recorded it")

	// The database has issued tokens in epoch 7; its server is on an earlier timeline.
	_, err = b.Pool.Exec(b.Ctx, `UPDATE fencelock.token_epoch SET last_epoch = 7`)
	require.NoError(t, err)
	for i, tc := range fencetest.TokenPaths {
		_, err := tc.Issue(t, b.Ctx, b.Pool, 10+i)
		require.ErrorIs(t, err, fencelock.ErrTokenEpochBehind, tc.Desc)
	}
	requireNothingHeld(t, b.Ctx, b.Pool, "lease:0")

	epoch, err := fencelock.RebaseTokenEpoch(b.Ctx, b.Pool, 0)
	require.NoError(t, err)
	require.EqualValues(t, 8, epoch)
	for i, tc := range fencetest.TokenPaths {
		token, err := tc.Issue(t, b.Ctx, b.Pool, 20+i)
		require.NoError(t, err, tc.Desc)
		require.EqualValues(t, 8, token.Epoch(), tc.Desc)
	}
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT last_epoch FROM fencelock.token_epoch`).Scan(&last))
	require.EqualValues(t, 8, last)
}

// Migration 00003 waits for a transaction that drew a token and holds off new token draws
// until it commits: a transaction open across it would keep running the old next_token (its
// cached plan) and could draw an epoch-0 token after others drew epoch tokens.
func TestMigrationWaitsForTokenTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := gooseProvider(t, b.Pool).DownTo(b.Ctx, 2)
	require.NoError(t, err)
	a, err := fencelock.NewAdvisoryLocker(b.Pool, fencelock.WithFencingTokens())
	require.NoError(t, err)
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	x, err := a.TryLockTx(b.Ctx, tx, "x")
	require.NoError(t, err)
	require.Zero(t, x.Epoch())

	migrated := make(chan error, 1)
	go func() { migrated <- fencelock.Migrate(context.WithoutCancel(b.Ctx), b.Pool) }()
	// The migration waits for tx: its lock on fencelock.token_flushes is not granted.
	require.Eventually(t, func() bool {
		var waiting bool
		err := b.Pool.QueryRow(b.Ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation IN ('fencelock.leases'::regclass, 'fencelock.token_flushes'::regclass)
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting)
		return err == nil && waiting
	}, 30*time.Second, 5*time.Millisecond, "the migration did not wait for the open token transaction")
	y, err := a.TryLockTx(b.Ctx, tx, "y") // still before the migration
	require.NoError(t, err)
	require.NoError(t, tx.Commit(b.Ctx))
	require.NoError(t, <-migrated)

	var later fencelock.Token
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) (err error) {
		later, err = a.TryLockTx(b.Ctx, tx, "y")
		return err
	}))
	require.Greater(t, later, y)
	require.Positive(t, later.Epoch())
}
